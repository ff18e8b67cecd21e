"""The one task that changes the device: coalesce, compute, diff, apply.

Each pass reads the member view as it is now (events that arrived while
the previous pass ran are coalesced into one), computes the desired peers
with the pure ``mesh`` functions, diffs them against the device, and
applies the plan only when it is not empty. A pass also runs every
``resync_interval`` with no event, which heals a device changed behind our
back. A failed apply is retried with backoff; the last written endpoints
are only recorded after a successful one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import trio

from vnetd.dataplane.base import Dataplane
from vnetd.errors import DataplaneError
from vnetd.mesh import Skipped, desired_peers, diff, written_after
from vnetd.model import Plan
from vnetd.retry import Backoff
from vnetd.spec import MeshSpec
from vnetd.watcher import MemberView

log = logging.getLogger("vnetd.reconcile")


@dataclass
class ReconcileStats:
    runs: int = 0
    applied: int = 0
    changes: int = 0
    failures: int = 0
    last_duration: float = 0.0
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
    ) -> None:
        self.spec = spec
        self.self_rank = self_rank
        self.self_key = self_key
        self.view = view
        self.dataplane = dataplane
        self.resync_interval = resync_interval
        self.stats = ReconcileStats()
        self._written: dict[str, str | None] = {}
        self._skipped_logged: set[tuple[int, str]] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reconcile forever.

        Cancellation: safe between passes; a plan is applied in one device
        transaction, so a cancel never leaves half a plan behind.
        """
        seen = -1
        backoff = Backoff(initial=0.1, maximum=5.0)
        task_status.started()
        while True:
            with trio.move_on_after(self.resync_interval):
                await self.view.wait_changed(seen)
            seen = self.view.version
            try:
                await self.reconcile_once()
                backoff.reset()
            except DataplaneError as exc:
                self.stats.failures += 1
                delay = backoff.next_delay()
                log.error("applying the plan failed: %s; retrying in %.1f s", exc, delay)
                seen = -1  # make the next pass run even without a new event
                await trio.sleep(delay)

    async def reconcile_once(self) -> Plan:
        """One pass; returns the plan it applied (possibly empty)."""
        started = time.perf_counter()
        self.stats.runs += 1
        desired, skipped = desired_peers(
            self.view.members, self.self_rank, self.spec, self.self_key
        )
        self._log_skipped(skipped)
        actual = await self.dataplane.peers()
        plan = diff(desired, actual, self._written)
        ranks = {key: peer.rank for key, peer in desired.items() if peer.rank is not None}
        if plan:
            await self.dataplane.apply(plan)
            self.stats.applied += 1
            self.stats.changes += len(plan)
            self._log_plan(plan, ranks, time.perf_counter() - started)
        self._written = written_after(desired)
        self.stats.peer_ranks = ranks
        self.stats.last_duration = time.perf_counter() - started
        return plan

    def _log_plan(self, plan: Plan, ranks: dict[str, int], elapsed: float) -> None:
        old_ranks = self.stats.peer_ranks
        for peer in plan.add:
            log.info("peer joined: rank %s at %s", peer.rank, peer.endpoint or "no endpoint")
        for peer in plan.remove:
            log.info("peer left: rank %s", old_ranks.get(peer.public_key, "?"))
        for upd in plan.update:
            rank = ranks.get(upd.public_key, "?")
            if upd.endpoint is not None:
                before = self._written.get(upd.public_key) or "none"
                log.info("peer rank %s endpoint moved from %s to %s", rank, before, upd.endpoint)
            if upd.allowed_ips is not None:
                log.info("peer rank %s allowed IPs set to %s", rank, ",".join(upd.allowed_ips))
        log.info("plan applied: %d change(s) in %.1f ms", len(plan), elapsed * 1000)

    def _log_skipped(self, skipped: list[Skipped]) -> None:
        for item in skipped:
            entry = (item.rank, item.reason)
            if entry not in self._skipped_logged:
                self._skipped_logged.add(entry)
                log.warning("member rank %s skipped: %s", entry[0], entry[1])
