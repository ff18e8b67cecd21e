"""A daemon's registry with relays: the members read through a relay, all else from etcd.

``RelayedRegistry`` sends ``list_prefix`` and ``watch`` of the prefixes ``relayed``
names (a mesh's members) to the relays, as an ``EtcdRegistry`` of the relays' URLs
(each relay serves that part of etcd's JSON gateway: ``relay.app``; the registry moves
a watch between relays from the revision after its last event, as between etcd
members), and every other call, writes included, to etcd. Records read through a relay
are checked as any others (``control.member_view``): a relay can delay one, never forge
one.

A list through the relays must not go back: a relay's revision is its last member event
(it cannot know etcd's own without one), so a daemon that read etcd directly, or a
relay further along, can have seen a later one. A relay's list older than the last
revision read of that prefix is left for etcd's, and only etcd's going back is a reset
(the watcher's "registry was reset", which would otherwise also be logged for a relay
behind etcd).

When no relay answers, the read goes to etcd itself, and a watch that breaks on its last
relay is resumed on etcd from the revision after its last event, so the daemon's view
has no gap (a start older than etcd's history is etcd's "compacted": the watcher lists
again). Relays that failed are skipped for ``RELAYS_REST`` s (``FIRST_REST`` while
none has answered yet: relays that start beside the daemons); then a member watch on
etcd ends with ``WatchMoved`` and the watcher opens it again, through the relays, from
the revision after its last event (no list). While neither answers, the calls fail as
etcd's do and the data plane stays as it is (invariant 5).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from vnetd.errors import RegistryUnavailable, WatchMoved
from vnetd.registry.base import KeyValue, Registry, WatchEvent

log = logging.getLogger("vnetd.registry")

RELAYS_REST = 30.0
"""Seconds the relays are skipped after none of them answered."""
FIRST_REST = 5.0
"""Seconds the relays are skipped when none has answered yet: relays rendered with the
mesh start beside its daemons (one ``kubectl apply``), which read etcd meanwhile."""


class RelayedRegistry:
    """A ``Registry`` whose reads of ``relayed`` prefixes go to ``relays`` first."""

    def __init__(self, direct: Registry, relays: Registry, relayed: Callable[[str], bool]) -> None:
        self.direct = direct
        self.relays = relays
        self._relayed = relayed
        self._rest_until = -1.0
        self._seen: dict[str, int] = {}  # a relayed prefix -> the last revision read of it
        self._answered = False  # a relay has answered once

    def saw(self, prefix: str, revision: int) -> None:
        """Events of ``prefix`` up to ``revision`` were read (a watch's batch)."""
        self._seen[prefix] = max(self._seen.get(prefix, 0), revision)

    def _use_relays(self, prefix: str) -> bool:
        return self._relayed(prefix) and trio.current_time() >= self._rest_until

    def relays_failed(self, what: str, exc: Exception) -> None:
        rest = RELAYS_REST if self._answered else FIRST_REST
        self._rest_until = trio.current_time() + rest
        log.warning("relays: %s failed (%s); reading etcd directly for %.0f s", what, exc, rest)

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        if self._use_relays(prefix):
            try:
                kvs, revision = await self._relay_list(prefix)
            except RegistryUnavailable as exc:
                self.relays_failed(f"list {prefix}", exc)
            else:
                seen = self._seen.get(prefix, 0)
                if revision >= seen:
                    self._seen[prefix] = revision
                    return kvs, revision
                log.info(
                    "relays: their list of %s is at revision %d, behind the %d read before "
                    "(a relay behind etcd); listing etcd",
                    prefix, revision, seen,
                )  # fmt: skip
        kvs, revision = await self.direct.list_prefix(prefix)
        if self._relayed(prefix):
            self._seen[prefix] = revision  # etcd's word: lower only if it was reset
        return kvs, revision

    async def _relay_list(self, prefix: str) -> tuple[list[KeyValue], int]:
        found = await self.relays.list_prefix(prefix)
        self._answered = True
        return found

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        if not self._use_relays(prefix):
            async with self.direct.watch(prefix, start_revision) as batches:
                yield _Noted(self, prefix, batches, self._moves(prefix))
            return
        async with AsyncExitStack() as stack:
            try:
                relayed = await stack.enter_async_context(self.relays.watch(prefix, start_revision))
                self._answered = True
            except RegistryUnavailable as exc:
                self.relays_failed(f"watch {prefix}", exc)
                direct = await stack.enter_async_context(self.direct.watch(prefix, start_revision))
                yield _Noted(self, prefix, direct, self._moves(prefix))
                return
            yield _FallingBack(self, stack, prefix, start_revision, relayed)

    def _moves(self, prefix: str) -> float:
        """When a watch of ``prefix`` on etcd moves back to the relays (``WatchMoved``):
        when their rest ends, for the members; never for any other prefix."""
        return self._rest_until if self._relayed(prefix) else math.inf

    async def get(self, key: str) -> KeyValue | None:
        return await self.direct.get(key)

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        return await self.direct.create(key, value, lease)

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        return await self.direct.replace(key, value, mod_revision, lease)

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        return await self.direct.create_all(items)

    async def delete(self, key: str) -> bool:
        return await self.direct.delete(key)

    async def grant(self, ttl: int) -> int:
        return await self.direct.grant(ttl)

    async def keepalive(self, lease: int) -> int:
        return await self.direct.keepalive(lease)

    async def revoke(self, lease: int) -> None:
        await self.direct.revoke(lease)

    async def aclose(self) -> None:
        """The caller closes the two registries it gave (``opener``)."""


def members_prefixes(registry_prefix: str) -> Callable[[str], bool]:
    """Which prefixes a relay serves: ``<prefix>/<mesh>/members/`` of any mesh
    (``control.membership``'s layout)."""
    head = registry_prefix.rstrip("/") + "/"

    def relayed(prefix: str) -> bool:
        if not prefix.startswith(head) or not prefix.endswith("/members/"):
            return False
        mesh = prefix[len(head) : -len("/members/")]
        return bool(mesh) and "/" not in mesh

    return relayed


class _FallingBack:
    """The relays' batches; when they break, etcd's from the revision after the last (its
    watch entered on the caller's ``stack``, so it closes with the relays' watch)."""

    def __init__(
        self,
        registry: RelayedRegistry,
        stack: AsyncExitStack,
        prefix: str,
        start_revision: int,
        relayed: AsyncIterator[list[WatchEvent]],
    ) -> None:
        self._registry = registry
        self._stack = stack
        self._prefix = prefix
        self._after = start_revision
        self._relayed = relayed
        self._direct: AsyncIterator[list[WatchEvent]] | None = None

    def __aiter__(self) -> _FallingBack:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        if self._direct is None:
            try:
                batch = await self._relayed.__anext__()
            except RegistryUnavailable as exc:
                what = f"watch {self._prefix} from revision {self._after}"
                self._registry.relays_failed(what, exc)
                watch = self._registry.direct.watch(self._prefix, self._after)
                self._direct = await self._stack.enter_async_context(watch)
            else:
                if batch:
                    self._after = batch[-1].mod_revision + 1
                    self._registry.saw(self._prefix, batch[-1].mod_revision)
                return batch
        return await _next_noted(self._registry, self._prefix, self._direct)


class _Noted:
    """etcd's ``batches``, each noted as read (``RelayedRegistry.saw``), until ``moves``:
    then ``WatchMoved``, so the watcher goes on through the relays from the revision after
    its last event (a relay that was down when the daemon started, say)."""

    def __init__(
        self,
        registry: RelayedRegistry,
        prefix: str,
        batches: AsyncIterator[list[WatchEvent]],
        moves: float,
    ) -> None:
        self._registry, self._prefix, self._batches = registry, prefix, batches
        self._moves = moves

    def __aiter__(self) -> _Noted:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        with trio.move_on_at(self._moves):
            return await _next_noted(self._registry, self._prefix, self._batches)
        raise WatchMoved("relays: trying them again for the member watch")


async def _next_noted(
    registry: RelayedRegistry, prefix: str, batches: AsyncIterator[list[WatchEvent]]
) -> list[WatchEvent]:
    batch = await batches.__anext__()
    if batch:
        registry.saw(prefix, batch[-1].mod_revision)
    return batch
