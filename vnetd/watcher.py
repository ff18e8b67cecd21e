"""Keep a local view of the members: list, then watch from that revision.

On compaction or any watch error the members are listed again and the view
replaced, so a missed event heals on its own; the watch is also restarted
every ``resync_interval`` to bound how long a silently dead stream can go
unnoticed. While the registry is unreachable the view is kept exactly as it
is (static stability): nobody is removed because etcd is down.
"""

from __future__ import annotations

import logging

import trio

from vnetd.errors import RegistryUnavailable, WatchCompacted
from vnetd.membership import BadEntry, decode_member, members_prefix, rank_of_key
from vnetd.model import Member
from vnetd.registry.base import KeyValue, Registry, WatchEvent
from vnetd.retry import Backoff, RegistryHealth
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.watch")


class MemberView:
    """The members as last seen, with a change signal for the reconciler."""

    def __init__(self) -> None:
        self.members: dict[int, Member] = {}
        self.bad_entries: dict[str, str] = {}
        self.bad_total = 0
        self.version = 0
        self.synced = False
        self._changed = trio.Event()

    def replace(self, spec: MeshSpec, kvs: list[KeyValue]) -> None:
        members: dict[int, Member] = {}
        bad: dict[str, str] = {}
        for kv in kvs:
            member = self._decode(spec, kv.key, kv.value, bad)
            if member is not None:
                members[member.rank] = member
        self.members = members
        self.bad_entries = bad
        self.synced = True
        self._bump()

    def apply(self, spec: MeshSpec, event: WatchEvent) -> None:
        self.bad_entries.pop(event.key, None)
        if event.kind == "delete":
            rank = rank_of_key(spec, event.key)
            if rank is not None and self.members.pop(rank, None) is not None:
                self._bump()
            return
        member = self._decode(spec, event.key, event.value, self.bad_entries)
        if member is None:
            rank = rank_of_key(spec, event.key)
            if rank is not None and self.members.pop(rank, None) is not None:
                self._bump()
        elif self.members.get(member.rank) != member:
            self.members[member.rank] = member
            self._bump()

    def _decode(self, spec: MeshSpec, key: str, value: bytes, bad: dict[str, str]) -> Member | None:
        try:
            return decode_member(spec, key, value)
        except BadEntry as exc:
            if key not in self.bad_entries:
                log.warning("skipping bad registry entry: %s", exc)
                self.bad_total += 1
            bad[key] = str(exc)
            return None

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, since: int) -> None:
        """Return once ``version`` is past ``since``."""
        while self.version <= since:
            await self._changed.wait()


async def sync_members(
    registry: Registry,
    spec: MeshSpec,
    view: MemberView,
    health: RegistryHealth,
    *,
    resync_interval: float = 60.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``view`` in step with the registry forever.

    Cancellation: safe at any point; the view keeps its last state.
    """
    prefix = members_prefix(spec)
    backoff = Backoff()
    task_status.started()
    while True:
        try:
            kvs, revision = await registry.list_prefix(prefix)
            health.ok()
            backoff.reset()
            view.replace(spec, kvs)
            with trio.move_on_after(resync_interval) as scope:
                async with registry.watch(prefix, revision + 1) as events:
                    async for event in events:
                        view.apply(spec, event)
            if not scope.cancelled_caught:  # the stream ended by itself
                log.info("member watch ended; listing members again")
                await trio.sleep(backoff.next_delay())
        except WatchCompacted as exc:
            log.info("%s; listing members again", exc)
        except RegistryUnavailable as exc:
            health.failed("watch", exc)
            await trio.sleep(backoff.next_delay())
