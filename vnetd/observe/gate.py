"""``/gatez``: the mesh gate a MiniCluster's Flux container polls before its broker starts.

The gate is open when every rank this rank's broker connects to (its parent and
children in Flux's tree: ``wait.gate.tbon_neighbours``) is registered and this
device has completed a WireGuard handshake with it (or, for a rank behind a site
gateway, with the gateway: ``wait.gate.carriers``): ``vnetd wait --reachable``'s
condition (``wait.gate.evaluate``), read from the running daemon's own member view
and device instead of a second watch. A foreign service-mesh sidecar in the pod
(``doctor.sidecars``) shuts it for good (409): waiting will not remove it.

``verdict`` (asked once, when the Flux container's bound has expired) is ``vnetd
doctor``'s verdict for the ranks that did not answer: this daemon's probe service
probes them and asks up to ``HELPERS`` ranks it does reach for their rows about them
(``daemon.probe_service``'s ``rows_about``), and ``doctor.cause.classify`` names one
cause per rank. The silent ranks' own rows are not asked for: a rank this device has
no session with cannot be reached over the overlay either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import trio

from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView
from vnetd.dataplane.base import Dataplane
from vnetd.doctor.cause import Evidence, classify
from vnetd.doctor.evidence import Row
from vnetd.doctor.report import failing_lines
from vnetd.doctor.sidecars import PROC_TABLES, proxy_lines
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Member
from vnetd.observe.http import Check
from vnetd.spec import MeshSpec
from vnetd.wait.gate import Gate, carriers, evaluate, handshake_keys, tbon_neighbours

DEVICE_READ_TIMEOUT = 2.0
ROW_DEADLINE = 9.0
"""What the probe service is given for the verdict's row (s), as ``vnetd doctor`` gives
each service: its echoes take up to 4.5 s, 7.3 s with bisection."""
REFUSED = 409

HELPERS = 3
"""Ranks that answer, asked for their rows about the silent ones: a rank none of them
reaches either is another fault than one only this pod cannot reach."""

RowSource = Callable[[list[int], list[int], float], Awaitable[dict[int, Row]]]
"""The rows about the ranks given (first list): this daemon's, from its probe service,
and those of the helpers (second list) that answer, within the deadline (s)."""


class GatedDaemon(Protocol):
    """What the gate reads of a started daemon."""

    @property
    def view(self) -> MemberView: ...
    @property
    def dataplane(self) -> Dataplane: ...
    @property
    def health(self) -> RegistryHealth: ...


def read_proc_tables() -> list[str]:
    """This network namespace's TCP tables (a table the kernel lacks is skipped)."""
    tables = []
    for name in PROC_TABLES:
        try:
            tables.append(Path(name).read_text())
        except OSError:
            continue
    return tables


class MeshGate:
    """The gate of one daemon; ``row_source`` is set once its probe service runs."""

    def __init__(
        self,
        spec: MeshSpec,
        me: Member,
        read_tables: Callable[[], list[str]] = read_proc_tables,
    ) -> None:
        self.spec = spec
        self.me = me
        self.read_tables = read_tables
        self.row_source: RowSource | None = None
        self._one_verdict = trio.Lock()

    def proxies(self) -> list[str]:
        """A line for each foreign sidecar proxy listening in this pod."""
        return proxy_lines(self.read_tables(), self.spec.interface)

    async def check(self, running: GatedDaemon | None, fanout: int, verdict: bool) -> Check:
        """Open (200), not yet (503, with what is missing), or refused (409: a foreign
        sidecar); with ``verdict``, a shut gate's body is the doctor's verdict."""
        proxies = await trio.to_thread.run_sync(self.proxies)
        if proxies:
            return Check(False, "\n".join(proxies), REFUSED)
        if running is None:
            return Check(False, f"rank {self.me.rank}: vnetd is starting")
        needed = tbon_neighbours(self.me.rank, self.spec.size, fanout)
        gate = Gate(self.spec.size, (self.me.rank, *needed), None, self.me.rank, True)
        registered = {
            rank: member.public_key
            for rank, member in running.view.members.items()
            if rank not in running.view.held
        }
        peers = await _device_peers(running.dataplane)
        handshakes = handshake_keys(peers)
        registered = carriers(self.spec, registered, peers)
        status = evaluate(gate, registered, handshakes, listed=running.view.synced)
        summary = f"rank {self.me.rank}: {status.summary}"
        if status.ready or not verdict:
            return Check(status.ready, summary)
        silent = [rank for rank in needed if registered.get(rank, "") not in handshakes]
        helpers = sorted(r for r, k in registered.items() if k in handshakes)[:HELPERS]
        async with self._one_verdict:
            lines = await self._verdict(running, silent, helpers, registered)
        return Check(False, "\n".join([summary, *lines]))

    async def _verdict(
        self,
        running: GatedDaemon,
        silent: list[int],
        helpers: list[int],
        registered: dict[int, str],
    ) -> list[str]:
        members = {r: m for r, m in running.view.members.items() if r in registered}
        rows: dict[int, Row] = {}
        notes = []
        probed = [rank for rank in silent if rank in members]
        if self.row_source is None:
            notes.append("no probe service runs here (mesh.doctor_port 0): devices not read")
        elif probed and self.me.rank in members:
            with trio.move_on_after(ROW_DEADLINE + 3.0):
                rows = await self.row_source(probed, helpers, ROW_DEADLINE)
        evidence = Evidence(self.spec, members, rows, running.health.full)
        verdicts = [classify(evidence, self.me.rank, rank) for rank in silent]
        return failing_lines(verdicts) + [f"note: {note}" for note in notes]


async def _device_peers(dataplane: Dataplane) -> Mapping[str, DevicePeer]:
    with trio.move_on_after(DEVICE_READ_TIMEOUT):
        try:
            return await dataplane.peers()
        except DataplaneError:
            return {}
    return {}
