"""The HTTP endpoints of a daemon: what ``/healthz``, ``/readyz``, ``/metrics``,
``/status`` and ``/gatez`` answer, read from its components.

The endpoint is served from the start, before the device exists, so a probe
sees "not ready: starting" rather than a refused connection; the running
daemon's components are attached once they exist. What they read of it is
``RunningDaemon``, which ``vnetd.daemon.running.Running`` satisfies: observe sits
below the daemon runtime and imports nothing of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from vnetd.control.claim import ClaimHolder
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView
from vnetd.dataplane.base import Dataplane, restarts_of
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Member
from vnetd.observe.gate import MeshGate
from vnetd.observe.http import Check
from vnetd.observe.metrics import DaemonMetrics, Snapshot
from vnetd.observe.readiness import readiness
from vnetd.spec import MeshSpec
from vnetd.status.view import as_json, registry_full_note

DEVICE_READ_TIMEOUT = 2.0


class PassCounts(Protocol):
    """The reconciler's counters (``ReconcileStats``) that the metrics read."""

    @property
    def runs(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def handshakes_started(self) -> int: ...
    @property
    def rings(self) -> int: ...
    @property
    def rings_dropped(self) -> int: ...
    @property
    def peer_ranks(self) -> Mapping[str, int]: ...


class CountingReconciler(Protocol):
    @property
    def stats(self) -> PassCounts: ...


class RunningDaemon(Protocol):
    """What the endpoints read of a started daemon."""

    @property
    def view(self) -> MemberView: ...
    @property
    def claim(self) -> ClaimHolder: ...
    @property
    def reconciler(self) -> CountingReconciler: ...
    @property
    def dataplane(self) -> Dataplane: ...
    @property
    def health(self) -> RegistryHealth: ...


class DaemonEndpoints:
    """``Endpoints`` over a daemon; ``attach`` the running components once started."""

    def __init__(self, spec: MeshSpec, me: Member, metrics: DaemonMetrics) -> None:
        self.spec = spec
        self.me = me
        self.daemon_metrics = metrics
        self.dataplane: Dataplane | None = None
        self.running: RunningDaemon | None = None
        self.started = time.time()
        self.black_holes: dict[int, int] = {}
        """Peers whose route MTU the probe service locked after finding a black hole."""
        self.mesh_gate = MeshGate(spec, me)

    def black_hole(self, rank: int, mtu: int) -> None:
        """The probe service locked ``rank``'s route MTU to ``mtu`` (a path-MTU black hole)."""
        self.black_holes[rank] = mtu
        self.daemon_metrics.black_holes.set(len(self.black_holes))

    def attach_dataplane(self, dataplane: Dataplane) -> None:
        """The device is up (the registry may not have answered yet)."""
        self.dataplane = dataplane

    def attach(self, running: RunningDaemon) -> None:
        """Every component runs."""
        self.dataplane = running.dataplane
        self.running = running

    async def health(self) -> Check:
        # Every task of the daemon runs in one nursery: if one had died, the
        # daemon (and this endpoint with it) would be gone. Answering is alive.
        uptime = time.time() - self.started
        phase = "up" if self.running is not None else "starting"
        return Check(True, f"ok: rank {self.me.rank} {phase} {uptime:.0f} s")

    async def ready(self) -> Check:
        if self.dataplane is None:
            return Check(False, f"not ready: starting ({self.spec.interface} not set up yet)")
        try:
            with trio.fail_after(DEVICE_READ_TIMEOUT):
                link = await self.dataplane.link_state()
        except (DataplaneError, trio.TooSlowError) as exc:
            return Check(False, f"not ready: cannot read {self.spec.interface}: {exc}")
        claim = self.running.claim if self.running is not None else None
        state = claim.state if claim is not None else "claiming"
        holder = claim.holder if claim is not None else None
        full = self.running.health.full if self.running is not None else None
        addresses = [str(address) for address in self.spec.addresses(self.me.rank)]
        # Dual stack: the link must hold both addresses before the claim counts.
        for address in addresses[1:]:
            check = readiness(link, self.spec.interface, address, "claimed")
            if not check.ok:
                return check
        return readiness(
            link,
            self.spec.interface,
            addresses[0],
            state,
            self.me.rank,
            holder,
            registry_full_note(full) if full is not None else None,
        )

    async def gate(self, fanout: int, verdict: bool) -> Check:
        """``/gatez``: the MiniCluster's mesh gate (``vnetd.observe.gate``)."""
        return await self.mesh_gate.check(self.running, fanout, verdict)

    async def metrics(self) -> bytes:
        if self.running is not None:
            self.daemon_metrics.update(await self._snapshot(self.running))
        return self.daemon_metrics.exposition()

    async def status(self) -> dict[str, Any]:
        """This rank's view: the document of ``vnetd status --json``, plus ``self``."""
        r = self.running
        notes = []
        if r is None:
            notes.append("daemon starting: no members read yet")
        elif r.health.reachable is False:
            notes.append("registry unreachable: members as last seen")
        if r is not None and r.health.full is not None:
            notes.append(registry_full_note(r.health.full))
        document = as_json(
            self.spec,
            r.view.members if r is not None else {},
            await self._device(r) if r is not None else None,
            time.time(),
            local_key=self.me.public_key,
            bad_entries=r.view.bad_total if r is not None else 0,
            notes=notes,
        )
        document["self"] = {
            "rank": self.me.rank,
            "address": str(self.spec.address(self.me.rank)),
            "addresses": [str(addr) for addr in self.spec.addresses(self.me.rank)],
            "endpoint": self.me.endpoint,
            "instance": self.me.instance,
            "claimed": r is not None and r.claim.state == "claimed",
            "claim": r.claim.state if r is not None else "claiming",
            "holder": r.claim.holder if r is not None else None,
            "held_by": _held_by(r, document["time"]),
            "spec_differs": r.claim.spec_check.differs if r is not None else None,
            "black_holes": {str(rank): mtu for rank, mtu in sorted(self.black_holes.items())},
            "registry_full": r.health.full if r is not None else None,
        }
        return document

    async def _device(self, r: RunningDaemon) -> dict[str, DevicePeer]:
        with trio.move_on_after(DEVICE_READ_TIMEOUT):
            try:
                return await r.dataplane.peers()
            except DataplaneError:
                return {}
        return {}

    async def _snapshot(self, r: RunningDaemon) -> Snapshot:
        now = time.time()
        return Snapshot(
            members=len(r.view.members),
            peers=await self._device(r),
            peer_ranks=dict(r.reconciler.stats.peer_ranks),
            reconcile_runs=r.reconciler.stats.runs,
            reconcile_failures=r.reconciler.stats.failures,
            handshakes_initiated=r.reconciler.stats.handshakes_started,
            doorbell_rings=r.reconciler.stats.rings,
            doorbell_rings_dropped=r.reconciler.stats.rings_dropped,
            # Invalid entries, and valid ones left out (a key registered earlier by another
            # rank, or by the signing key it is bound to).
            bad_entries=r.view.bad_total + r.reconciler.stats.skipped,
            watch_restarts=max(0, r.view.lists - 1),
            claims=r.claim.claims,
            refused_rewrites=r.view.refused_total,
            displaced=r.claim.displaced,
            restores=r.claim.restores,
            spec_differs=r.claim.spec_check.differs is not None,
            registry_errors=dict(r.health.errors_by_operation),
            registry_full=r.health.full is not None,
            registry_full_refusals=r.health.full_refusals,
            wireguard_restarts=restarts_of(r.dataplane),
            held_by=_held_by(r, now),
            now=now,
        )


def _held_by(r: RunningDaemon | None, now: float) -> dict[str, object] | None:
    """Who holds our rank while our claim waits (``claim_attempt.HeldBy``); else None."""
    held = r.claim.held_by if r is not None and r.claim.state != "claimed" else None
    return held.as_json(now) if held is not None else None
