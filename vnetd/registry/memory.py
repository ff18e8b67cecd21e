"""``MemoryRegistry``: an in-memory fake of the ``Registry`` protocol for unit tests.

It passes the same contract suite as ``EtcdRegistry``
(``tests/contract/test_registry.py``): one global revision, create/mod
revisions, leases that expire by ``trio.current_time()`` (so
``autojump_clock`` tests run instantly), watches from any kept revision,
``compact()`` and a ``fail()`` switch that simulates an outage.

Leases expire lazily: every call, and every open watch (which wakes at the
nearest lease deadline), first deletes the keys of expired leases. All keys
of one lease are deleted in one revision, as etcd does.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.bounds import kept_key, kept_value


@dataclass
class _Lease:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryRegistry:
    """A ``Registry`` held in memory; use inside ``trio.run``."""

    def __init__(self) -> None:
        self._revision = 1  # etcd starts at 1 with an empty store
        self._compacted = 0
        self._store: dict[str, KeyValue] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 0x1000
        self._history: list[WatchEvent] = []
        self._changed = trio.Event()
        self._unavailable = False

    # test controls

    def fail(self, unavailable: bool = True) -> None:
        """Make every call (and every open watch) raise ``RegistryUnavailable``."""
        self._unavailable = unavailable
        self._notify()

    def compact(self, revision: int) -> None:
        """Forget the history before ``revision``, as etcd's compaction does."""
        if revision <= self._compacted:
            raise RegistryError(f"compact {revision}: already compacted at {self._compacted}")
        if revision > self._revision:
            raise RegistryError(f"compact {revision}: beyond the current revision {self._revision}")
        self._compacted = revision
        del self._history[: bisect.bisect_left(self._history, revision, key=_revision_of)]

    # Registry

    async def get(self, key: str) -> KeyValue | None:
        self._enter()
        found = self._store.get(key)
        return _kept(found) if found else None

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._enter()
        kvs = sorted(_kept(kv) for key, kv in self._store.items() if key.startswith(prefix))
        return kvs, self._revision

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        self._enter()
        existing = self._store.get(key)
        if existing is not None:
            return _kept(existing)
        self._put(key, value, lease)
        return None

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        self._enter()
        if any(key in self._store for key in items):
            return False
        for key, value in items.items():
            self._put(key, value, 0)
        return True

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        self._enter()
        existing = self._store.get(key)
        if (existing.mod_revision if existing else 0) != mod_revision:
            return False
        self._put(key, value, lease)
        return True

    async def delete(self, key: str) -> bool:
        self._enter()
        if key not in self._store:
            return False
        self._revision += 1
        self._remove(key)
        self._notify()
        return True

    async def grant(self, ttl: int) -> int:
        self._enter()
        if ttl <= 0:
            raise RegistryError(f"lease ttl must be positive, got {ttl}")
        self._next_lease += 1
        self._leases[self._next_lease] = _Lease(ttl, trio.current_time() + ttl)
        self._notify()  # watchers re-arm their wake-up for the new deadline
        return self._next_lease

    async def keepalive(self, lease: int) -> int:
        self._enter()
        entry = self._leases.get(lease)
        if entry is None:
            return 0
        entry.deadline = trio.current_time() + entry.ttl
        return entry.ttl

    async def revoke(self, lease: int) -> None:
        self._enter()
        self._end_lease(lease)

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        self._enter()
        start = start_revision if start_revision > 0 else self._revision + 1
        if start < self._compacted:
            raise WatchCompacted(self._compacted)
        events = self._events(prefix, start)
        try:
            yield events
        finally:
            await events.aclose()

    async def aclose(self) -> None:
        """Nothing to release."""

    # internals

    def _enter(self) -> None:
        self._expire()
        if self._unavailable:
            raise RegistryUnavailable("memory registry: unavailable (fail() is on)")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _put(self, key: str, value: bytes, lease: int) -> None:
        if lease and lease not in self._leases:
            raise RegistryError(f"put {key!r}: lease {lease} not found")
        self._revision += 1
        old = self._store.get(key)
        if old is not None and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        create_revision = old.create_revision if old else self._revision
        self._store[key] = KeyValue(key, value, create_revision, self._revision, lease)
        if lease:
            self._leases[lease].keys.add(key)
        self._history.append(WatchEvent("put", key, value, self._revision, create_revision, lease))
        self._notify()

    def _remove(self, key: str) -> None:
        """Delete ``key`` at the current revision (already bumped by the caller)."""
        old = self._store.pop(key)
        if old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._history.append(WatchEvent("delete", key, b"", self._revision))

    def _end_lease(self, lease: int) -> None:
        entry = self._leases.pop(lease, None)
        if entry is None:
            return
        if entry.keys:
            self._revision += 1
            for key in sorted(entry.keys):
                self._remove(key)
        self._notify()

    def _expire(self) -> None:
        now = trio.current_time()
        for lease in [id_ for id_, entry in self._leases.items() if entry.deadline <= now]:
            self._end_lease(lease)

    def _next_deadline(self) -> float:
        return min((entry.deadline for entry in self._leases.values()), default=math.inf)

    async def _events(self, prefix: str, start: int) -> AsyncGenerator[list[WatchEvent], None]:
        """Every change pending under ``prefix`` as one batch, then wait for more."""
        position = start
        while True:
            self._enter()
            if position < self._compacted:
                raise WatchCompacted(self._compacted)
            first = bisect.bisect_left(self._history, position, key=_revision_of)
            pending = [
                replace(event, key=kept_key(event.key), value=kept_value(event.value))
                for event in self._history[first:]
                if event.key.startswith(prefix)
            ]
            position = self._revision + 1
            if pending:
                yield pending
            else:
                await self._wait_for_change()

    async def _wait_for_change(self) -> None:
        changed = self._changed
        with trio.move_on_at(self._next_deadline()):
            await changed.wait()


def _kept(kv: KeyValue) -> KeyValue:
    """What a read returns of ``kv``: its key and value bounded, as etcd's are."""
    return replace(kv, key=kept_key(kv.key), value=kept_value(kv.value))


def _revision_of(event: WatchEvent) -> int:
    return event.mod_revision
