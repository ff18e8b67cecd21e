"""The one task that changes the device: coalesce, compute, diff, apply.

A pass computes the peers of the ranks that changed (``MemberView.changed_since``)
and diffs them against what it applied (``mesh.AppliedPeers``); a full pass
computes everything and reads the device, at start and every
``resync_interval`` (spaced by the mesh's size: ``FULL_PASS_PEERS``). Only a
non-empty plan is applied. Between passes it
checks the few peers whose first handshake is due (``initiator.HandshakeWatch``).
The rules it keeps (O(change) passes, one initiator per pair, restarted
peers, resync requests) are in docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from vnetd.control.retry import Backoff
from vnetd.control.watcher import MemberView
from vnetd.daemon.plan_log import FlapLimit, log_checked, log_plan, readded, touched_ranks
from vnetd.dataplane.base import Dataplane
from vnetd.errors import DataplaneError
from vnetd.mesh.initiator import HandshakeWatch, PairRule
from vnetd.mesh.peers import (
    AppliedPeers,
    Skipped,
    added_peer,
    desired_peers,
    device_restarted,
    devices_after,
    diff,
    written_after,
)
from vnetd.mesh.rings import RingBook
from vnetd.model import DevicePeer, Member, Peer, Plan
from vnetd.pacing import spaced
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.reconcile")

FULL_PASS_PEERS = 8.0
"""Members a second the safety-net full pass may compute while nothing changes. A pass
costs CPU in proportion to the mesh (about 10 ms at 1023 peers on the 2026-12-04 lab
host, a quarter of a daemon's CPU at rest: ``bench/join_storm.py --resync``), so a mesh
larger than ``resync_interval`` times this (240 members at 30 s) takes it every N / 8 s
instead (128 s at 1024), and the pass costs a daemon the same CPU a second whatever
the mesh's size. Every other full pass (the first, after a list, a requested resync, a
changed rule of ours, a failed pass) comes when it is due, as before."""


@dataclass
class ReconcileStats:
    runs: int = 0
    applied: int = 0
    changes: int = 0
    failures: int = 0
    last_duration: float = 0.0
    handshake_retries: int = 0
    """Peers re-added because the handshake this side started did not complete."""
    fallbacks: int = 0
    """Peers whose initiator did not come: this side wrote the endpoint and started."""
    resyncs: int = 0
    skipped: int = 0
    """Members left out of the peers (a public key already registered earlier, our
    own key under another rank), each counted once, when it is first logged."""
    handshakes_started: int = 0
    """Handshakes this side started itself (``Plan.handshake``: eager pairs, retries,
    re-adds); a lazy pair's, which its first packet starts (through a ring or not), is not."""
    rings: int = 0
    """Datagrams our doorbell took from a lazy pair's responder (``daemon.doorbell``)."""
    rings_dropped: int = 0
    """Of those, the ones dropped unlooked-at: a repeat within 1 s, or a flood
    (``mesh.rings``)."""
    device_restarts: int = 0
    """Peers re-added because their device id changed under the same key."""
    peer_ranks: dict[str, int] = field(default_factory=dict)


class Reconciler:
    def __init__(
        self,
        spec: MeshSpec,
        self_rank: int,
        self_key: str,
        view: MemberView,
        dataplane: Dataplane,
        *,
        resync_interval: float = 30.0,
        on_pass: Callable[[float, int], None] | None = None,
    ) -> None:
        """Args:
        on_pass: called after every pass with its duration (s) and the
            number of changes applied (for the metrics).
        """
        self.on_pass = on_pass
        self.spec = spec
        self.self_rank = self_rank
        self.self_key = self_key
        self.view = view
        self.dataplane = dataplane
        self.resync_interval = resync_interval
        self.stats = ReconcileStats()
        self._written: dict[str, str | None] = {}
        self._devices: dict[str, str] = {}  # public key -> device id when last written
        self._skipped_logged: set[tuple[int, str]] = set()
        self._applied = AppliedPeers()  # what the passes applied (invariant 11)
        self._seen = -1  # the view's version the last pass computed from
        self._full_due = True  # the next pass reads the device and diffs every peer
        self._full_at = -math.inf  # when the last full pass ran
        self.handshakes = HandshakeWatch()
        self.flaps = FlapLimit()
        self._listed_at: int | None = None  # the view's revision at the first pass
        self._rule: tuple[object, ...] | None = None  # our side at the last pass
        self._synced = trio.Event()
        self._resync_reason: str | None = None
        self._after_resync: list[Callable[[], None]] = []
        self._waiting: trio.CancelScope | None = None  # the loop's wait, while it waits
        self.rings = RingBook()  # the doorbell's rings (``mesh.rings``)

    def request_resync(self, reason: str, then: Callable[[], None] | None = None) -> None:
        """Run a full pass now (the device was rebuilt); ``reason`` goes in its log line.

        Callable from any task; requests made before a pass starts are merged.

        Args:
            then: called once that pass has applied its plan (a failed pass is
                retried first).
        """
        self._resync_reason = reason
        if then is not None:
            self._after_resync.append(then)
        if self._waiting is not None:
            self._waiting.cancel()

    def ring(self, endpoint: str) -> None:
        """A lazy pair's responder, at its WireGuard ``endpoint``, sent its first packet to
        our doorbell (``daemon.doorbell``): start the pair's handshake (``initiator``)."""
        self.stats.rings += 1
        known = bool(self._applied.at(endpoint))
        if not self.rings.take(endpoint, trio.current_time(), known=known):
            self.stats.rings_dropped += 1  # a responder's WireGuard rings again with its retry
            return
        if self._answer_rings(endpoint) and self._waiting is not None:
            self._waiting.cancel()

    def _answer_rings(self, only: str | None = None) -> bool:
        """Hand each waiting ring (``only``: that endpoint's) whose peer we hold, lazy and
        ours to start, to the handshake watch; the others wait (``mesh.rings``)."""
        if not self.rings.waiting or not self.view.synced:
            return False  # before the first list, the pass that follows answers them
        now, pairs, answered = trio.current_time(), self.pair_rule(), False
        for peer in self.rings.answered(self._applied.at, now, only):
            if pairs.lazy(peer) and pairs.initiates(peer):
                self.handshakes.ring(added_peer(peer, pairs), now)
                answered = True
        return answered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reconcile forever.

        Cancellation: safe between passes. A plan is one device transaction,
        except that wireguard-go gets a big one as several ``set`` s (see
        ``UapiDataplane.apply``): a cancel or failure may leave the first of
        them applied, which the next (full) pass diffs against.
        """
        seen = -1
        backoff = Backoff(initial=0.1, maximum=5.0)
        task_status.started()
        next_resync = trio.current_time() + self.resync_period()
        while True:
            if not self.view.synced:
                # No list yet, so an empty view says nothing: a device adopted
                # from a previous run keeps its peers until a list says
                # otherwise (a new device has none to lose).
                await self.view.wait_changed(self.view.version)
                continue
            wake = min(next_resync, self.handshakes.next_check(), self.flaps.next_summary())
            if self._resync_reason is None:
                with trio.move_on_at(wake) as self._waiting:
                    await self.view.wait_changed(seen)
                self._waiting = None
            resync = self._resync_reason
            after: list[Callable[[], None]] = []
            try:
                if resync is None and self.view.version == seen:
                    if trio.current_time() < next_resync:
                        self.flaps.flush(trio.current_time())
                        await self.check_handshakes()
                        continue
                seen = self.view.version
                next_resync = trio.current_time() + self.resync_period()
                self._resync_reason = None
                after, self._after_resync = self._after_resync, []
                await self.reconcile_once(resync=resync)
                # The safety net counts from the last full pass, not from any pass.
                next_resync = self._full_at + self.resync_period()
                backoff.reset()
                for call in after:
                    call()
            except DataplaneError as exc:
                self.stats.failures += 1
                if resync is not None and self._resync_reason is None:
                    self._resync_reason = resync  # still owed
                self._after_resync[:0] = after
                delay = backoff.next_delay()
                log.error("applying the plan failed: %s; retrying in %.1f s", exc, delay)
                seen = -1  # make the next pass run even without a new event
                await trio.sleep(delay)

    def resync_period(self) -> float:
        """Seconds from one safety-net full pass to the next (``FULL_PASS_PEERS``)."""
        return spaced(self.resync_interval, len(self.view.members), FULL_PASS_PEERS)

    async def reconcile_once(self, *, resync: str | None = None) -> Plan:
        """One pass; returns the plan it applied (possibly empty).

        A pass diffs only the peers of the members changed since the last one
        against what it applied (invariant 11). A full pass computes every peer
        and diffs it against the device: the first, a requested resync, one
        every ``resync_interval``, the one after a failed pass, and after the
        members were listed again.

        Args:
            resync: why a full pass was requested; the pass then logs one
                summary line instead of a line per peer.
        """
        started = time.perf_counter()
        self.stats.runs += 1
        now = trio.current_time()
        pairs = self.pair_rule()
        # Our own registration decides which side of every pair starts (invariant 10):
        # when it changes (our claim, a takeover, our site or endpoints), every peer
        # is looked at again.
        rule = (pairs.registered, pairs.self_created, pairs.joining, _reach_of(pairs.self_member))
        full = (
            self._full_due
            or bool(self.spec.gateways)  # a gateway's peer carries other ranks' routes
            or resync is not None
            or now >= self._full_at + self.resync_period()
            or rule != self._rule
        )
        self._rule = rule
        changed = None if full else self.view.changed_since(self._seen)
        self._seen, self._full_due = self.view.version, True  # until this pass is through
        created = self.view.created
        if changed is None:
            self._applied.index(self.view.members)
            keys: set[str] | None = None
            desired, skipped = desired_peers(
                self.view.members, self.self_rank, self.spec, self.self_key, created
            )
            self._full_at = now
            read_started = time.perf_counter()
            actual: Mapping[str, DevicePeer | Peer] = await self.dataplane.peers()
            log.debug(
                "full pass: read %d peer(s) from the device in %.1f ms",
                len(actual),
                (time.perf_counter() - read_started) * 1000,
            )
        else:
            members, keys = self._applied.touched(self.view.members, changed)
            desired, skipped = desired_peers(
                members, self.self_rank, self.spec, self.self_key, created
            )
            actual = await self._applied_or_waiting(keys)
        self._log_skipped(skipped)
        watch = self.handshakes
        if pairs.registered:
            watch.registered(trio.current_time())
        else:
            watch.unregistered()
        plan = diff(
            desired,
            actual,
            self._written,
            self._devices,
            pairs=pairs,
            awaiting=watch.awaiting,
            wall=time.time() if changed is None else 0.0,  # the device was read
        )
        ranks = {key: peer.rank for key, peer in desired.items() if peer.rank is not None}
        if plan:
            await self.dataplane.apply(plan)
            self.stats.handshakes_started += len(plan.handshake)
            self.stats.applied += 1
            self.stats.changes += len(plan)
            again = readded(plan)
            self.stats.device_restarts += sum(
                device_restarted(peer, self._devices)
                for peer in plan.add
                if peer.public_key in again
            )
        if resync is None and (plan or plan.left_restarted):
            self._log_plan(plan, ranks, time.perf_counter() - started)
        if resync is not None:
            self.stats.resyncs += 1
            self._log_resync(resync, plan, len(desired), time.perf_counter() - started)
        self._record(desired, keys, ranks)
        self._full_due = False
        watch.note(plan, desired, trio.current_time())
        self._answer_rings()
        self.stats.last_duration = time.perf_counter() - started
        if self.on_pass is not None:
            self.on_pass(self.stats.last_duration, len(plan))
        if self.view.synced:
            self._synced.set()
        return plan

    async def _applied_or_waiting(self, keys: set[str]) -> dict[str, DevicePeer | Peer]:
        """What a pass over ``keys`` diffs against: what it applied, except for peers
        still waiting for their initiator's handshake, which are read from the device
        (whether it has learned their endpoint decides what may be written; one read,
        and only in the join window)."""
        applied: dict[str, DevicePeer | Peer] = dict(self._applied.of(keys))
        waiting = keys & self.handshakes.awaiting.keys()
        if waiting:
            device = await self.dataplane.peers()
            for key in waiting:
                if key in device:
                    applied[key] = device[key]
        return applied

    def _record(
        self, desired: dict[str, Peer], keys: set[str] | None, ranks: dict[str, int]
    ) -> None:
        """Note what a pass applied: the peers of ``keys`` (None: all of them)."""
        self._applied.applied(desired, keys)
        if keys is None:
            self._written = written_after(desired)
            self._devices = devices_after(desired)
            self.stats.peer_ranks = ranks
            return
        for key in keys:
            peer = desired.get(key)
            if peer is None:
                self._written.pop(key, None)
                self._devices.pop(key, None)
                self.stats.peer_ranks.pop(key, None)
            else:
                self._written[key] = peer.endpoint
                self._devices[key] = peer.device_id
                if peer.rank is not None:
                    self.stats.peer_ranks[key] = peer.rank

    async def wait_synced(self) -> None:
        """Return once a pass has applied the peers of a full list of the members."""
        await self._synced.wait()

    def pair_rule(self) -> PairRule:
        """Which side of each pair starts its handshakes, from the view as it is now."""
        mine = self.view.members.get(self.self_rank)
        registered = mine is not None and mine.public_key == self.self_key
        created = self.view.created.get(self.self_rank) if registered else None
        if self._listed_at is None:
            self._listed_at = self.view.revision
        return PairRule(
            self.self_key,
            registered,
            created,
            self.view.created,
            self.spec.persistent_keepalive,
            joining=created is None or created > self._listed_at,
            self_member=mine if registered else None,
            members=self.view.members,
            spec=self.spec,
            self_rank=self.self_rank,
        )

    async def check_handshakes(self) -> None:
        """Settle the peers whose first handshake is due (see ``initiator``): one device
        read, then one transaction for those still without a handshake."""
        now = trio.current_time()
        if self.handshakes.next_check() > now:
            return
        device = await self.dataplane.peers()
        self.handshakes.read_took(len(device))
        found = self.handshakes.check(device, now, time.time())
        if found.plan:
            try:
                await self.dataplane.apply(found.plan)
                # A ring's handshake is the traffic's, not the formation's: counted in rings.
                self.stats.handshakes_started += len(found.plan.handshake) - len(found.answered)
            except DataplaneError:
                # Part of the plan may be on the device (a refused set): the next pass
                # reads the device, and a fallback not written is due again.
                self.handshakes.failed(found, now)
                self._full_due = True
                raise
        self.stats.handshake_retries += len(found.retried)
        self.stats.fallbacks += len(found.fallbacks)
        log_checked(found)

    def _log_plan(self, plan: Plan, ranks: dict[str, int], elapsed: float) -> None:
        """The plan's lines, except those of ranks that flap (``plan_log.FlapLimit``)."""
        now = trio.current_time()
        old_ranks = self.stats.peer_ranks
        touched = touched_ranks(plan, ranks, old_ranks) | {p.rank for p in plan.left_restarted}
        quiet = {r for r in touched if r is not None and not self.flaps.named(r, now)}
        if plan:
            log_plan(plan, ranks, old_ranks, self._written, self._devices, elapsed, quiet)
        self._log_left_restarted(plan, quiet)

    def _log_left_restarted(self, plan: Plan, quiet: set[int]) -> None:
        for peer in plan.left_restarted:
            if peer.rank in quiet:
                continue
            log.info(
                "peer rank %s restarted its device (device id %s -> %s); its own "
                "handshake replaces the old session",
                peer.rank,
                self._devices.get(peer.public_key) or "?",
                peer.device_id,
            )

    def _log_resync(self, reason: str, plan: Plan, wanted: int, elapsed: float) -> None:
        if plan:
            log.info(
                "after %s: re-applied %d peer(s) (%d added, %d updated, %d removed) in %.1f ms",
                reason,
                wanted,
                len(plan.add),
                len(plan.update),
                len(plan.remove),
                elapsed * 1000,
            )
        else:
            log.info("after %s: the device already holds all %d peer(s)", reason, wanted)

    def _log_skipped(self, skipped: list[Skipped]) -> None:
        for item in skipped:
            entry = (item.rank, item.reason)
            if entry not in self._skipped_logged:
                self._skipped_logged.add(entry)
                self.stats.skipped += 1
                log.warning("member rank %s skipped: %s", entry[0], entry[1])


def _reach_of(member: Member | None) -> tuple[str, bool, bool] | None:
    """What of our own entry decides which side of a cross-site pair can reach the other."""
    if member is None:
        return None
    return member.site, member.endpoint is not None, member.public_endpoint is not None
