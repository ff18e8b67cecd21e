"""The local view of the members a watcher keeps: who holds each rank, what a reader
accepts of a rewrite (the claim rules), bad entries counted, and the changes since a
version for incremental passes (docs/architecture.md, "Watch", "Store resets" and
"Readers enforce the claim rules"). ``watcher`` fills it from the registry."""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
from collections.abc import Iterable

import trio

from vnetd.control.holders import KeyBindings, RecordOrder, may_rewrite
from vnetd.control.log_limit import LogLimit
from vnetd.control.membership import BadEntry, check_proof, decode_member, describe, rank_of_key
from vnetd.control.watch_batch import Unproven, last_per_key
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.watch")


RESET_GRACE_TTLS = 2
"""How many lease TTLs members missing after a registry reset are kept."""

BAD_ENTRIES_REMEMBERED = 1000
"""Bad keys kept by name (so each is logged once); beyond, they are only counted."""
COPY_ORDER = 1 << 62
"""Added to the create revision of a copy of a bound public key: it orders after
every registration (``mesh.desired_peers`` gives a key to its earliest)."""
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

    ``leases`` maps each member's rank to the lease its entry is bound to (0:
    none). ``bindings`` holds which signing key each public key belongs to; an
    entry carrying a key bound to another signing key is a copy: its rank is
    ordered after every registration in ``created`` (so the key's holder keeps
    its peer) and noted in ``bindings.copies`` (``control.holders``).
    ``overwritten`` maps a rank to the mod revision of the last rewrite of its
    entry that was refused: the holder writes its record back. ``order`` refuses a
    signed record not after the last one accepted from its signing key at its rank
    (a replay).
    """

    def __init__(self) -> None:
        self.members: dict[int, Member] = {}
        self.held: dict[int, float] = {}
        self.created: dict[int, int] = {}
        self.leases: dict[int, int] = {}
        self.bindings = KeyBindings()
        self.overwritten: dict[int, int] = {}
        self.order = RecordOrder()
        self._grace = 0.0
        self._proven: dict[str, tuple[int, bytes]] = {}
        """Rank key -> (lease, digest) of the signed record last verified there."""
        self.unproven: dict[int, Unproven] = {}
        """Rank -> a member taken with its proof not verified: it decided nothing
        (docs/architecture.md, "Proofs"); verified once it would."""
        self._taken: Unproven | None = None
        """What ``_decode`` took unverified, until ``_accepted`` places it."""
        self.deferred_total = 0
        """Records taken unverified (each verified later only if it comes to decide)."""
        self.revision = 0
        """The highest store revision seen: of the last list, or of an event since."""
        self.bad_entries: dict[str, str] = {}
        self.bad_total = 0
        self.refused: dict[int, int] = {}
        """Rank -> create revision of an entry whose rewrite was refused (logged once)."""
        self.refused_total = 0
        """Rewrites refused (once per entry), copies, and every replay refused."""
        self._bad_log = LogLimit(log, "bad registry entries", "bad entries")
        self._refused_log = LogLimit(log, "refused registry writes", "refused writes")
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
        self._grace = RESET_GRACE_TTLS * spec.registry.lease_ttl
        members: dict[int, Member] = {}
        created: dict[int, int] = {}
        leases: dict[int, int] = {}
        bad: dict[str, str] = {}
        listed: list[tuple[KeyValue, Member]] = []
        for rank in list(self.unproven):  # a list defers nothing: its keys bind at once
            self._prove(rank, drop=True, bad=None)
        for kv in kvs:
            member = self._decode(spec, kv.key, kv.value, bad, kv.lease, defer=False)
            member = self._accepted(
                spec, kv.key, member, kv.create_revision, kv.lease, kv.mod_revision
            )
            if member is not None:
                listed.append((kv, member))
        # Signed registrations first, each kind in create order: a signed member's key
        # is bound before an unsigned copy of it is looked at.
        listed.sort(key=lambda item: (not item[1].signing_key, item[0].create_revision))
        kept_copies = dict(self.bindings.copies)
        self.bindings.copies.clear()
        for kv, member in listed:
            rank = member.rank
            if member is self.members.get(rank):  # a refused rewrite: the old one stays
                created[rank] = self.created.get(rank, kv.create_revision)
                leases[rank] = self.leases.get(rank, 0)
                if rank in kept_copies:
                    self.bindings.copies[rank] = kept_copies[rank]
            else:
                created[rank] = self._ordered(member, kv.create_revision)
                leases[rank] = kv.lease
            self.bindings.bind(member)
            members[rank] = member
        held: dict[int, float] = {}
        shift = self.revision + 1 if hold_until is not None else 0  # below the new store's
        for rank, member in self.members.items():
            until = hold_until if hold_until is not None else self.held.get(rank)
            if rank not in members and until is not None and until > now:
                members[rank] = member
                created[rank] = self.created.get(rank, 0) - shift
                leases[rank] = self.leases.get(rank, 0)
                held[rank] = until
        for rank in sorted(set(self.held) - set(held) - set(members)):
            log.warning("rank %d did not register again after the registry reset; dropped", rank)
        self.members = dict(sorted(members.items()))
        self.created = created
        self.leases = leases
        self.bindings.recount(self.members.values(), self._grace)
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
        """Take a batch of watch events as one change: one ``version`` bump at most;
        only the events ``last_per_key`` keeps are decoded."""
        for event in last_per_key(events):
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
            self._proven.pop(event.key, None)
            if rank is not None:
                self.bindings.copies.pop(rank, None)
            self._drop(rank)
            return
        self._grace = RESET_GRACE_TTLS * spec.registry.lease_ttl
        decoded = self._decode(
            spec, event.key, event.value, self.bad_entries, event.lease, event.mod_revision
        )
        old = self.members.get(rank) if rank is not None else None
        member = self._accepted(
            spec, event.key, decoded, event.create_revision, event.lease, event.mod_revision
        )
        if member is None:
            self._drop(rank)
        elif member is not old:
            if rank is not None:
                self.bindings.copies.pop(rank, None)
            order = self._ordered(member, event.create_revision)
            changed = old != member or self.created.get(member.rank) != order
            if old is not None:
                self.bindings.remove(old, self._grace)
            taken = self._taken
            if taken is not None and taken.rank == member.rank:
                self.unproven[member.rank] = taken
            else:
                self.unproven.pop(member.rank, None)
            self.bindings.add(member, proven=member.rank not in self.unproven)
            self.members[member.rank] = member
            self.created[member.rank] = order
            self.leases[member.rank] = event.lease
            if changed:
                self._batch.add(member.rank)
        self._taken = None

    def _accepted(
        self,
        spec: MeshSpec,
        key: str,
        member: Member | None,
        create_revision: int,
        lease: int,
        mod_revision: int,
    ) -> Member | None:
        """``member`` as written at ``key``; the member we had there if the write breaks
        the claim rules (``may_rewrite``) in an entry never deleted, or is a replay of
        an older record (``RecordOrder``); None for a replay in a new entry."""
        rank = rank_of_key(spec, key)
        if rank is None:
            return member
        old = self.members.get(rank)
        if old is None or rank in self.held or create_revision == 0:
            old = None  # a held member's entry is the new store's: a new claim
        elif self.created.get(rank) != create_revision:
            old = None  # deleted and created again: a new claim, taken as it is
        highest = self.order.refusal(member, mod_revision) if member is not None else None
        if member is not None and highest is not None:
            self._refuse_replay(member, highest, lease, mod_revision)
            if old is None:
                return None
        elif old is None or (member is not None and may_rewrite(old, member)):
            if member is not None and (self._taken is None or self._taken.rank != rank):
                self.order.accept(member, mod_revision)  # a proven record's seq only
            return member
        self.overwritten[rank] = mod_revision  # the holder writes its record back
        if self.refused.get(rank) != create_revision and highest is None:
            self.refused[rank] = create_revision
            self.refused_total += 1
            by = member.instance if member is not None else "a bad entry (named above)"
            signed = " (signed; the rewrite is not signed by its key)" if old.signing_key else ""
            held_by = old.instance
            self._refused_log.warn(
                lambda: (
                    f"refusing a rewrite of rank {rank}'s entry by {by}: it is held by "
                    f"{held_by}{signed} and was not deleted in between (create revision "
                    f"{create_revision}); keeping {held_by}'s member"
                ),
                self.refused_total,
            )
        return old

    def _refuse_replay(self, member: Member, highest: int, lease: int, revision: int) -> None:
        """Count and log a record not after the last one accepted from its signing key."""
        rank = member.rank
        self.refused_total += 1
        self._refused_log.warn(
            lambda: (
                f"refusing rank {rank}'s record by {describe(member)} (lease {lease:x}, "
                f"mod revision {revision}): its "
                f"seq {member.seq} is not after {highest}, the last accepted from that key "
                "at this rank: a replay of an older record"
            ),
            self.refused_total,
        )

    def _ordered(self, member: Member, create_revision: int) -> int:
        """The registration order of ``member``: its create revision, or, when it carries a
        public key bound to another signing key (a copy: logged once, counted), after
        every registration, so the key's signed holder keeps its peer."""
        copy, line = self.bindings.refuse_copy(member, create_revision, self.members)
        if line is not None:
            self.refused_total += 1
            self._refused_log.warn(line, self.refused_total)
        return create_revision + COPY_ORDER if copy else create_revision

    def _drop(self, rank: int | None) -> None:
        if rank is None:
            return
        self._prove(rank, drop=False, bad=None)  # an unproven one: its key's grace needs it
        self.created.pop(rank, None)
        self.leases.pop(rank, None)
        old = self.members.pop(rank, None)
        if old is not None:
            self.bindings.remove(old, self._grace)
            self._batch.add(rank)

    def held_until(self) -> float:
        """When the next held member's grace ends (``inf`` when none is held)."""
        return min(self.held.values(), default=math.inf)

    def _decode(
        self,
        spec: MeshSpec,
        key: str,
        value: bytes,
        bad: dict[str, str],
        lease: int,
        mod_revision: int = 0,
        *,
        defer: bool = True,
    ) -> Member | None:
        """The member ``value`` holds, its proof verified unless it decides nothing (a
        first claim, ``defer``: then noted in ``_taken``); None for a bad entry."""
        self._taken = None
        seen = (lease, hashlib.blake2b(value, digest_size=16).digest())
        rank = rank_of_key(spec, key)
        waiting = self.unproven.get(rank) if rank is not None else None
        if waiting is not None and (waiting.key, waiting.seen) != (key, seen):
            self._prove(waiting.rank, drop=True, bad=None)  # compared with a new record
            waiting = None
        proven = self._proven.get(key) == seen or waiting is not None
        defer = defer and not (spec.rank_ca or spec.registry.relays)  # "Proofs where ..." (e), (f)
        try:
            member = decode_member(spec, key, value, lease, proven=proven or defer, leased=True)
            if member.signing_key and not proven and defer:
                if not self._decides(spec, member):
                    self._taken = Unproven(member.rank, key, value, lease, seen, mod_revision)
                    self.deferred_total += 1
                    return member
                check_proof(key, value, lease)
        except BadEntry as exc:
            self._proven.pop(key, None)
            self._bad(key, exc, bad)
            return None
        if self.unproven and self.bindings.carried(member):  # an unsigned copy too
            self._prove_carriers(member)
        if waiting is not None:
            self._taken = waiting  # the same write again (a re-list): still unproven
        elif member.signing_key:  # one entry per rank key: a re-list verifies nothing twice
            self._proven[key] = seen
        return member

    def _decides(self, spec: MeshSpec, member: Member) -> bool:
        """Whether ``member``'s proof decides who holds an entry or a key: a rewrite, a
        seq compared, a pinned gateway rank, a key bound or carried (docs/architecture.md,
        "Proofs"). The members that carry its keys unproven are verified first."""
        rank = member.rank
        if rank in self.members or rank in self.held or spec.pinned_key(rank) is not None:
            return True
        if self.order.knows(rank, member.signing_key):
            return True
        if self.bindings.owner(member.public_key) is not None:
            return True
        if not self.bindings.carried(member):
            return False
        self._prove_carriers(member)
        return True

    def _prove_carriers(self, member: Member) -> None:
        """Verify the unproven members at other ranks that carry ``member``'s public key
        or signing key: one of them may be bound, or be the copy."""
        for other in [r for r in self.unproven if r in self.members and r != member.rank]:
            carrier = self.members[other]
            signer = member.signing_key
            if member.public_key == carrier.public_key or (
                signer and signer == carrier.signing_key
            ):
                self._prove(other, drop=True, bad=self.bad_entries)

    def _prove(self, rank: int, *, drop: bool, bad: dict[str, str] | None) -> None:
        """Verify the proof of the member taken unproven at ``rank``: once verified its
        key is bound and its seq ordered; a forged one is a bad entry (``drop``: gone;
        remembered in ``bad`` while its entry is still there)."""
        waiting = self.unproven.pop(rank, None)
        if waiting is None:
            return
        try:
            check_proof(waiting.key, waiting.value, waiting.lease)
        except BadEntry as exc:
            self._bad(waiting.key, exc, {} if bad is None else bad)
            if drop:
                self._drop(rank)
            return
        self._proven[waiting.key] = waiting.seen
        member = self.members.get(rank)
        if member is not None:
            self.bindings.bind(member)
            self.order.accept(member, waiting.mod_revision)

    def _bad(self, key: str, exc: BadEntry, bad: dict[str, str]) -> None:
        if key not in self.bad_entries:
            self.bad_total += 1
            self._log_bad(exc)
        if key in bad or len(bad) < BAD_ENTRIES_REMEMBERED:
            bad[key] = str(exc)

    def _log_bad(self, exc: BadEntry) -> None:
        """Name a bad entry, at most ``log_limit.NAMED`` a minute; summarise the rest (a
        flood of junk keys would otherwise be as many lines)."""
        self._bad_log.warn(lambda: f"skipping bad registry entry: {exc}", self.bad_total)

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, since: int) -> None:
        """Return once ``version`` is past ``since``."""
        while self.version <= since:
            await self._changed.wait()


def _version_of(change: tuple[int, int]) -> int:
    return change[0]
