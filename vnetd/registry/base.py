"""The ``Registry`` protocol: the few etcd v3 operations vnetd needs.

Both implementations (``etcd.EtcdRegistry`` over the v3 JSON gateway and
``memory.MemoryRegistry`` for unit tests) pass the same contract suite in
``tests/contract/test_registry.py``. Membership logic (claims, records)
lives above this seam in ``vnetd.control.membership`` and never sees the backend.

Semantics, as in etcd v3:

* Every write bumps the store's revision by one; a key's ``mod_revision``
  is the revision of its last write, ``create_revision`` of its creation.
* A key written with a lease is deleted when the lease expires or is
  revoked, and the deletion is seen by watchers.
* ``watch`` streams events strictly after ``start_revision - 1`` in
  revision order, in batches: one per etcd watch message. etcd sends a
  watcher that is up to date one message per revision, and one that resumes
  from an older revision up to 1000 revisions per message; the member watch
  (``vnetd.control.watcher``) uses that to take a join storm in batches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, order=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True)
class WatchEvent:
    """One change. ``create_revision`` is the key's (for a put; 0 for a delete), as
    in ``KeyValue``: a put that re-creates a deleted key carries a new one.
    ``lease`` is the lease the put bound the key to (0: none, and for a delete)."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int
    create_revision: int = 0
    lease: int = 0


class Registry(Protocol):
    """Every call has its own timeout and raises ``RegistryUnavailable`` when
    the backend cannot be reached, ``RegistryError`` when it refuses.
    """

    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None."""
        ...

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the store revision."""
        ...

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        """Write ``key`` only if it does not exist.

        Returns:
            None when the key was created; otherwise the existing entry.
        """
        ...

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        """Write ``key`` only if its ``mod_revision`` is still the given one."""
        ...

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        """Write every key (without a lease) in one transaction, only if none exists.

        Returns:
            True when all were written; False (nothing written) when any existed.
        """
        ...

    async def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        ...

    async def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id."""
        ...

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease``; returns the remaining TTL, 0 if it has expired."""
        ...

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now; keys bound to it are deleted. Unknown leases are ignored."""
        ...

    def watch(
        self, prefix: str, start_revision: int
    ) -> AbstractAsyncContextManager[AsyncIterator[list[WatchEvent]]]:
        """Stream changes under ``prefix`` from ``start_revision`` on, as batches.

        Each batch is the events of one etcd watch message (of the changes
        pending at once, for the fake): never empty, in revision order.

        Raises (on entry or while iterating):
            WatchCompacted: ``start_revision`` is older than the oldest kept.
            RegistryUnavailable: the stream could not be opened or broke.

        Cancellation: cancelling the consumer closes the stream.
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
