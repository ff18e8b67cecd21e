"""Keep a local view of the members: list, then watch from that revision.

A compaction or a watch error lists again and replaces the view; the watch
is resumed from the last revision every ``resync_interval``; a store reset
holds the missing members for a grace period; readers refuse rewrites that
break the claim rules. The why of each is in docs/architecture.md, "Watch",
"Store resets" and "Readers enforce the claim rules".
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import NoReturn

import trio

from vnetd.control.membership import BadEntry, decode_member, members_prefix, rank_of_key
from vnetd.control.retry import Backoff, RegistryHealth, retry_registry
from vnetd.control.storm import StormGauge
from vnetd.errors import RegistryUnavailable, WatchCompacted
from vnetd.model import Member
from vnetd.registry.base import KeyValue, Registry, WatchEvent
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.watch")

RESET_GRACE_TTLS = 2
"""How many lease TTLs members missing after a registry reset are kept."""

BAD_ENTRIES_REMEMBERED = 1000
"""Bad keys kept by name (so each is logged once); beyond, they are only counted."""
BAD_ENTRIES_NAMED = 20
"""Bad entries logged by name per ``BAD_LOG_WINDOW``; the rest go into one summary line."""
BAD_LOG_WINDOW = 60.0
CHANGES_KEPT = 4096
"""Changed ranks remembered for ``MemberView.changed_since``; a reader further behind
gets "everything"."""


class MemberView:
    """The members as last seen, with a change signal for the reconciler.

    ``members`` includes the held ones (see the module doc); ``held`` maps
    each of those ranks to the ``trio.current_time()`` it is kept until.

    ``created`` maps each member's rank to the store revision that created its
    entry, which orders registrations: a public key belongs to its earliest
    (``mesh.desired_peers``). A takeover rewrites an entry and keeps its create
    revision; an entry deleted (its lease ended) and claimed again gets a new
    one. Members held after a reset keep their order among themselves and come
    before every entry of the new store, whose revisions start again low: they
    were registered first (their revisions are shifted below zero).
    """

    def __init__(self) -> None:
        self.members: dict[int, Member] = {}
        self.held: dict[int, float] = {}
        self.created: dict[int, int] = {}
        self.revision = 0
        """The highest store revision seen: of the last list, or of an event since."""
        self.bad_entries: dict[str, str] = {}
        self.bad_total = 0
        self.refused: dict[int, int] = {}
        """Rank -> create revision of an entry whose rewrite was refused (logged once)."""
        self.refused_total = 0
        self._bad_window_start = -math.inf
        self._bad_named = 0
        self._bad_unnamed = 0
        self.version = 0
        self.synced = False
        self.lists = 0
        """How many times the members were listed (the first list and every re-list)."""
        self._changed = trio.Event()
        self._changes: list[tuple[int, int]] = []
        """(version, rank) of each rank changed by a batch, in version order."""
        self._changes_floor = 0
        """``_changes`` holds every change made after this version (a list is "all")."""
        self._batch: set[int] = set()

    def replace(
        self,
        spec: MeshSpec,
        kvs: list[KeyValue],
        revision: int = 0,
        *,
        now: float = -math.inf,
        hold_until: float | None = None,
    ) -> None:
        """Take a full list of the members (at store ``revision``) as the view.

        A member missing from the list is dropped, unless it is held: since a
        reset (``hold_until`` is given: it is held until then) or still within
        the grace of an earlier one (its deadline is after ``now``).
        """
        members: dict[int, Member] = {}
        created: dict[int, int] = {}
        bad: dict[str, str] = {}
        for kv in kvs:
            member = self._decode(spec, kv.key, kv.value, bad)
            member = self._accepted(spec, kv.key, member, kv.create_revision)
            if member is not None:
                members[member.rank] = member
                created[member.rank] = kv.create_revision
        held: dict[int, float] = {}
        shift = self.revision + 1 if hold_until is not None else 0  # below the new store's
        for rank, member in self.members.items():
            until = hold_until if hold_until is not None else self.held.get(rank)
            if rank not in members and until is not None and until > now:
                members[rank] = member
                created[rank] = self.created.get(rank, 0) - shift
                held[rank] = until
        for rank in sorted(set(self.held) - set(held) - set(members)):
            log.warning("rank %d did not register again after the registry reset; dropped", rank)
        self.members = dict(sorted(members.items()))
        self.created = created
        self.held = held
        self.revision = revision
        self.bad_entries = bad
        self.synced = True
        self.lists += 1
        self._batch.clear()
        self._bump()
        self._changes.clear()
        self._changes_floor = self.version

    def apply(self, spec: MeshSpec, event: WatchEvent) -> None:
        """Take one watch event (a batch of one)."""
        self.apply_batch(spec, (event,))

    def apply_batch(self, spec: MeshSpec, events: Iterable[WatchEvent]) -> None:
        """Take a batch of watch events as one change: one ``version`` bump at most."""
        for event in events:
            self._apply_one(spec, event)
        if self._batch:
            self._bump()
            self._changes += [(self.version, rank) for rank in sorted(self._batch)]
            self._batch.clear()
            if len(self._changes) > CHANGES_KEPT:
                self._forget_changes()

    def changed_since(self, version: int) -> set[int] | None:
        """The ranks whose member or registration changed after ``version``.

        None means "everything": a list replaced the view since (the first
        one, a re-list, a reset), or ``version`` is older than the changes kept.
        """
        if version < self._changes_floor:
            return None
        first = bisect.bisect_right(self._changes, version, key=_version_of)
        return {rank for _, rank in self._changes[first:]}

    def _forget_changes(self) -> None:
        """Keep the newer half of the change log (whole versions)."""
        self._changes_floor = self._changes[len(self._changes) // 2][0]
        del self._changes[
            : bisect.bisect_right(self._changes, self._changes_floor, key=_version_of)
        ]

    def _apply_one(self, spec: MeshSpec, event: WatchEvent) -> None:
        self.revision = max(self.revision, event.mod_revision)
        self.bad_entries.pop(event.key, None)
        rank = rank_of_key(spec, event.key)
        if rank is not None:
            self.held.pop(rank, None)
        if event.kind == "delete":
            self._drop(rank)
            return
        decoded = self._decode(spec, event.key, event.value, self.bad_entries)
        member = self._accepted(spec, event.key, decoded, event.create_revision)
        if member is None:
            self._drop(rank)
        elif (
            self.members.get(member.rank) != member
            or self.created.get(member.rank) != event.create_revision
        ):
            self.members[member.rank] = member
            self.created[member.rank] = event.create_revision
            self._batch.add(member.rank)

    def _accepted(
        self, spec: MeshSpec, key: str, member: Member | None, create_revision: int
    ) -> Member | None:
        """``member`` as written at ``key``, or the member we had there if the write
        breaks the claim rules (another instance, or junk, in an entry never deleted)."""
        rank = rank_of_key(spec, key)
        if rank is None or rank in self.held:
            return member
        old = self.members.get(rank)
        if old is None or self.created.get(rank) != create_revision or create_revision == 0:
            return member
        if member is not None and member.rank == rank and member.instance == old.instance:
            return member
        if self.refused.get(rank) != create_revision:
            self.refused[rank] = create_revision
            self.refused_total += 1
            log.warning(
                "refusing a rewrite of rank %d's entry by %s: it is held by %s and was not "
                "deleted in between (create revision %d); keeping %s's member",
                rank,
                member.instance if member is not None else "an unreadable record",
                old.instance,
                create_revision,
                old.instance,
            )
        return old

    def _drop(self, rank: int | None) -> None:
        if rank is None:
            return
        self.created.pop(rank, None)
        if self.members.pop(rank, None) is not None:
            self._batch.add(rank)

    def held_until(self) -> float:
        """When the next held member's grace ends (``inf`` when none is held)."""
        return min(self.held.values(), default=math.inf)

    def _decode(self, spec: MeshSpec, key: str, value: bytes, bad: dict[str, str]) -> Member | None:
        try:
            return decode_member(spec, key, value)
        except BadEntry as exc:
            if key not in self.bad_entries:
                self.bad_total += 1
                self._log_bad(exc)
            if key in bad or len(bad) < BAD_ENTRIES_REMEMBERED:
                bad[key] = str(exc)
            return None

    def _log_bad(self, exc: BadEntry) -> None:
        """Name a bad entry, at most ``BAD_ENTRIES_NAMED`` per window; summarise the rest.

        A flood of junk keys (100,000 of them) would otherwise be as many log
        lines, and remembering every key as many strings.
        """
        now = time.monotonic()
        if now - self._bad_window_start >= BAD_LOG_WINDOW:
            if self._bad_unnamed:
                log.warning(
                    "skipped %d more bad registry entries without naming them "
                    "(%d bad entries seen in all)",
                    self._bad_unnamed,
                    self.bad_total - 1,
                )
            self._bad_window_start, self._bad_named, self._bad_unnamed = now, 0, 0
        if self._bad_named < BAD_ENTRIES_NAMED:
            self._bad_named += 1
            log.warning("skipping bad registry entry: %s", exc)
            if self._bad_named == BAD_ENTRIES_NAMED:
                log.warning(
                    "more than %d bad registry entries in %.0f s: counting the rest, "
                    "naming them again after that",
                    BAD_ENTRIES_NAMED,
                    BAD_LOG_WINDOW,
                )
        else:
            self._bad_unnamed += 1

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
    reset_grace: float | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``view`` in step with the registry forever.

    Args:
        resync_interval: the watch is restarted (from the last revision seen) this often.
        reset_grace: how long members missing after a registry reset are
            kept; None means ``RESET_GRACE_TTLS`` lease TTLs.

    Cancellation: safe at any point; the view keeps its last state.
    """
    prefix = members_prefix(spec)
    grace = RESET_GRACE_TTLS * spec.registry.lease_ttl if reset_grace is None else reset_grace
    backoff = Backoff()
    gauge = StormGauge()
    listed = False
    resuming = False  # the next watch resumes a storm's after a pause
    task_status.started()

    async def follow() -> NoReturn:
        """List, then watch; list again after a compaction, a reset's grace or a
        stream that ended; in a storm, end the watch after a batch and resume it
        after a pause. Raises ``RegistryUnavailable``; a retry lists first, except
        after a storm's resume that could not open (a loaded etcd or client): that
        is tried once more as a resume, not as an O(N) list for etcd and for us (a
        reset store refuses a resume: ``EtcdRegistry`` checks its revision)."""
        nonlocal listed, resuming
        while True:
            opening = resumed = False
            try:
                if not listed:
                    kvs, revision = await registry.list_prefix(prefix)
                    health.ok()
                    backoff.reset()
                    _take_list(spec, view, kvs, revision, grace)
                    listed = True
                # The watch also ends when a held member's grace does: the list
                # that follows drops it if it has not registered again.
                held_until = view.held_until()
                resync_at = trio.current_time() + resync_interval
                pause = 0.0
                with trio.move_on_at(min(resync_at, held_until)) as timer:
                    async with AsyncExitStack() as stack:
                        opening, resumed = True, resuming
                        batches = await stack.enter_async_context(
                            registry.watch(prefix, view.revision + 1)
                        )
                        opening = resuming = False
                        health.ok()
                        async for batch in batches:
                            view.apply_batch(spec, batch)
                            pause = gauge.pause_after(
                                trio.current_time(), len(batch), len(view.members)
                            )
                            if pause:
                                break
                    if not pause:
                        log.info("member watch ended; listing members again")
                        listed = False
                        await trio.sleep(backoff.next_delay())
                if pause:
                    await trio.sleep(pause)  # then resume: etcd sends the batch since
                    resuming = True
                elif timer.cancelled_caught and held_until <= resync_at:
                    listed = False
            except WatchCompacted as exc:
                log.info("%s; listing members again", exc)
                listed = False
            except RegistryUnavailable:
                # A storm's resume that did not open is tried once more as a resume.
                listed = listed and opening and resumed
                resuming = False
                raise

    await retry_registry("watch", follow, health, backoff)


def _version_of(change: tuple[int, int]) -> int:
    return change[0]


def _take_list(
    spec: MeshSpec, view: MemberView, kvs: list[KeyValue], revision: int, grace: float
) -> None:
    """Replace the view with a fresh list, holding the missing members after a reset."""
    now = trio.current_time()
    if not (view.synced and revision < view.revision):
        view.replace(spec, kvs, revision, now=now)
        return
    old_revision = view.revision
    view.replace(spec, kvs, revision, now=now, hold_until=now + grace)
    log.warning(
        "registry was reset (revision %d → %d): keeping %d members for %.0f s "
        "while they re-register",
        old_revision,
        revision,
        len(view.held),
        grace,
    )
