"""The one task that changes the device: coalesce, compute, diff, apply.

A pass computes the peers of the ranks that changed (``MemberView.changed_since``)
and diffs them against what it applied (``mesh.AppliedPeers``); a full pass
computes everything and reads the device, at start and every
``resync_interval``. Only a non-empty plan is applied. The rules it keeps
(O(change) passes, crossed handshakes, restarted peers, resync requests) are
in docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from vnetd.control.watcher import MemberView
from vnetd.dataplane.base import Dataplane
from vnetd.errors import DataplaneError
from vnetd.mesh import (
    AppliedPeers,
    Skipped,
    desired_peers,
    devices_after,
    diff,
    written_after,
)
from vnetd.model import DevicePeer, Peer, Plan
from vnetd.retry import Backoff
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.reconcile")

NUDGE_AFTER = 1.0  # seconds after a join with no handshake before re-adding the peer
NUDGE_WINDOW = 10.0  # only peers younger than this are watched


@dataclass
class ReconcileStats:
    runs: int = 0
    applied: int = 0
    changes: int = 0
    failures: int = 0
    last_duration: float = 0.0
    nudges: int = 0
    resyncs: int = 0
    skipped: int = 0
    """Members left out of the peers (a public key already registered earlier, our
    own key under another rank), each counted once, when it is first logged."""
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
        self._young: dict[str, float] = {}  # public key -> when it was added
        self._applied = AppliedPeers()  # what the passes applied (invariant 11)
        self._seen = -1  # the view's version the last pass computed from
        self._full_due = True  # the next pass reads the device and diffs every peer
        self._full_at = -math.inf  # when the last full pass ran
        self._synced = trio.Event()
        self._resync_reason: str | None = None
        self._after_resync: list[Callable[[], None]] = []
        self._waiting: trio.CancelScope | None = None  # the loop's wait, while it waits

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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reconcile forever.

        Cancellation: safe between passes; a plan is applied in one device
        transaction, so a cancel never leaves half a plan behind.
        """
        seen = -1
        backoff = Backoff(initial=0.1, maximum=5.0)
        task_status.started()
        next_resync = trio.current_time() + self.resync_interval
        while True:
            if not self.view.synced:
                # No list yet, so an empty view says nothing: a device adopted
                # from a previous run keeps its peers until a list says
                # otherwise (a new device has none to lose).
                await self.view.wait_changed(self.view.version)
                continue
            wake = next_resync
            if self._young:
                wake = min(wake, trio.current_time() + NUDGE_AFTER / 4)
            if self._resync_reason is None:
                with trio.move_on_at(wake) as self._waiting:
                    await self.view.wait_changed(seen)
                self._waiting = None
            resync = self._resync_reason
            after: list[Callable[[], None]] = []
            try:
                if resync is None and self.view.version == seen:
                    if trio.current_time() < next_resync:
                        await self.nudge_handshakes()
                        continue
                seen = self.view.version
                next_resync = trio.current_time() + self.resync_interval
                self._resync_reason = None
                after, self._after_resync = self._after_resync, []
                await self.reconcile_once(resync=resync)
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
        full = self._full_due or resync is not None or now >= self._full_at + self.resync_interval
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
            actual: Mapping[str, DevicePeer | Peer] = await self.dataplane.peers()
        else:
            members, keys = self._applied.touched(self.view.members, changed)
            desired, skipped = desired_peers(
                members, self.self_rank, self.spec, self.self_key, created
            )
            actual = self._applied.of(keys)
        self._log_skipped(skipped)
        plan = diff(desired, actual, self._written, self._devices)
        ranks = {key: peer.rank for key, peer in desired.items() if peer.rank is not None}
        if plan:
            await self.dataplane.apply(plan)
            self.stats.applied += 1
            self.stats.changes += len(plan)
            self.stats.device_restarts += len(_readded(plan))
            if resync is None:
                self._log_plan(plan, ranks, time.perf_counter() - started)
        if resync is not None:
            self.stats.resyncs += 1
            self._log_resync(resync, plan, len(desired), time.perf_counter() - started)
        self._record(desired, keys, ranks)
        self._full_due = False
        now = trio.current_time()
        for peer in plan.remove:
            self._young.pop(peer.public_key, None)
        for peer in plan.add:  # a peer re-added after a device restart is young again
            self._young[peer.public_key] = now
        self.stats.last_duration = time.perf_counter() - started
        if self.on_pass is not None:
            self.on_pass(self.stats.last_duration, len(plan))
        if self.view.synced:
            self._synced.set()
        return plan

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

    async def nudge_handshakes(self) -> None:
        """Re-add young peers stuck without a handshake (see the module doc)."""
        now = trio.current_time()
        self._young = {k: t for k, t in self._young.items() if now - t < NUDGE_WINDOW}
        if not self._young:
            return
        device = await self.dataplane.peers()
        stuck = []
        for key, added in list(self._young.items()):
            peer = device.get(key)
            rank = self.stats.peer_ranks.get(key)
            if peer is None or rank is None or peer.last_handshake:
                self._young.pop(key, None)
                continue
            wait = NUDGE_AFTER if self.self_rank < rank else 2 * NUDGE_AFTER
            if now - added >= wait and peer.tx_bytes:
                stuck.append(Peer(key, peer.allowed_ips, peer.endpoint, rank))
                self._young.pop(key, None)  # once per join
        if stuck:
            await self.dataplane.apply(Plan(remove=tuple(stuck), add=tuple(stuck)))
            self.stats.nudges += len(stuck)
            for nudged in stuck:
                log.info(
                    "peer rank %s: no handshake %.1f s after joining; re-added it to restart "
                    "the handshake",
                    nudged.rank,
                    NUDGE_AFTER,
                )

    def _log_plan(self, plan: Plan, ranks: dict[str, int], elapsed: float) -> None:
        old_ranks = self.stats.peer_ranks
        readded = _readded(plan)
        for peer in plan.add:
            if peer.public_key in readded:
                before = self._written.get(peer.public_key, peer.endpoint)
                if peer.endpoint is not None and before != peer.endpoint:
                    log.info(
                        "peer rank %s endpoint moved from %s to %s",
                        peer.rank,
                        before or "none",
                        peer.endpoint,
                    )
                log.info(
                    "peer rank %s restarted its device (device id %s -> %s); re-added it "
                    "to drop the old session",
                    peer.rank,
                    self._devices.get(peer.public_key) or "?",
                    peer.device_id,
                )
            else:
                log.info("peer joined: rank %s at %s", peer.rank, peer.endpoint or "no endpoint")
        for peer in plan.remove:
            if peer.public_key not in readded:
                log.info("peer left: rank %s", old_ranks.get(peer.public_key, "?"))
        for upd in plan.update:
            rank = ranks.get(upd.public_key, "?")
            if upd.endpoint is not None:
                before = self._written.get(upd.public_key) or "none"
                log.info("peer rank %s endpoint moved from %s to %s", rank, before, upd.endpoint)
            if upd.allowed_ips is not None:
                log.info("peer rank %s allowed IPs set to %s", rank, ",".join(upd.allowed_ips))
        log.info("plan applied: %d change(s) in %.1f ms", len(plan), elapsed * 1000)

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


def _readded(plan: Plan) -> set[str]:
    """Keys removed and added in one plan: peers whose device restarted (see ``mesh.diff``)."""
    return {peer.public_key for peer in plan.remove} & {peer.public_key for peer in plan.add}
