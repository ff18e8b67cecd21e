"""One etcd cluster fault, end to end: a meshed lab, the fault, and what it cost.

Used by ``tests/e2e/test_etcd_cluster.py`` (which asserts on the figures) and
``bench/etcd_faults.py`` (which records them). Five pods, three etcd members,
every daemon given all three endpoints (the same order, as one config gives
them, so every daemon starts on member 0). Ranks 0-3 are meshed first; the
fault starts; ``start_after`` s later rank 3's pod is killed (SIGKILL, as a
node failure) and rank 4 started; the fault ends ``duration`` s after it
began. Probes run between every pair all along (``vnetd.lab.probe``).

Faults, each on member 0 (the one every daemon talks to) unless said:
``leader-killed`` (SIGKILL of whichever member leads, restarted at the end),
``frozen`` (a follower: the leadership is moved off member 0 first; SIGSTOP,
SIGCONT at the end), ``frozen-leader`` (member 0 made the leader first, then
frozen as ``frozen``), ``partitioned`` (cut from the other
two members, healed at the end), ``rolling-restart`` (member 0 stopped with
SIGTERM for the fault, then members 1 and 2 stopped and started one at a
time), ``replaced`` (``member remove`` at the start, a fresh member added at
the end).

A frozen leader is its own case because of an etcd bug: a leader that resumes
after a pause still believes it leads for a moment, finds every lease expired
by its own clock (the keepalives went to the new leader) and proposes their
revocation, and etcd before 3.4.31 and 3.5.13 forwards those proposals to the
new leader, which commits them (etcd-io/etcd#15247, fixed by ignoring a former
leader's revocations: etcd-io/etcd#16822). Every daemon then sees its entry go
and claims its rank again; ``FaultRun.claim_losses`` says when and how fast.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from vnetd.lab.cluster import MeshLab
from vnetd.lab.etcd_cluster import EtcdCluster
from vnetd.lab.open_lab import Lab, open_lab

FAULTS = ("leader-killed", "frozen", "frozen-leader", "partitioned", "rolling-restart", "replaced")
PODS = 5
KEPT = frozenset({0, 1, 2})
"""Ranks meshed before the fault and running throughout: no probe may be lost between them."""
STOPPED = 3
STARTED = 4
MISS_AFTER = 1.0
"""The probe's default: a request unanswered this long is lost."""
FORM_TIMEOUT = 30.0
RESTART_PAUSE = 2.0
"""How long each member is down in a rolling restart (member 0: the fault's duration)."""


def old_leader_may_revoke(version: str) -> bool:
    """Whether etcd ``version`` commits a resumed former leader's lease revocations
    (before 3.4.31, and 3.5 before 3.5.13; see the module docstring). An unknown
    version is assumed to."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if found is None:
        return True
    major, minor, patch = (int(part) for part in found.groups())
    fixed_in = {(3, 4): 31, (3, 5): 13}.get((major, minor))
    if fixed_in is not None:
        return patch < fixed_in
    return (major, minor) < (3, 4)


@dataclass
class ClaimLoss:
    """A claim a running daemon lost and took again (its ``claiming rank N again`` line)."""

    rank: int
    after_end: float
    """Seconds from the fault's end (a thaw, a heal, a restart) to the loss; negative before it."""
    regained_after: float
    """Seconds from the loss to the next ``claimed rank`` line (nan: none)."""


@dataclass
class FaultRun:
    """What one fault cost; times in seconds."""

    fault: str
    duration: float
    start_after: float
    ttl: int
    reached_after_start: float = float("nan")
    """From rank 4's start until every kept rank and it had reached each other."""
    reached_after_fault: float = float("nan")
    """The same, from the fault's start."""
    dropped_after_stop: float = float("nan")
    """From rank 3's pod being killed until no kept rank's device has it as a peer."""
    probes_lost: dict[str, int] = field(default_factory=dict)
    """Requests lost per pair of kept ranks (``"a->b"``) from the fault until after its end."""
    probes_lost_before_stop: int = 0
    """Requests lost between ranks 0-3 from the fault until rank 3 was killed."""
    fewest_replies: int = 0
    """The fewest replies any kept pair got over the window: the probes did run."""
    claims: dict[int, int] = field(default_factory=dict)
    """``claimed rank`` lines per running daemon: 1 each when no claim was lost."""
    claim_losses: list[ClaimLoss] = field(default_factory=list)
    """Each claim lost and taken again, by the daemons' own log times."""
    etcd_version: str = ""
    """What the members report (``endpoint status``)."""
    exited: dict[int, int] = field(default_factory=dict)
    """Daemons that exited (rank -> code), rank 3's killed one left out."""
    watch_moves: int = 0
    """``etcd watch on ...; resumed on ...`` lines, all daemons together."""
    outages: int = 0
    """``registry unreachable during`` lines, all daemons together."""
    seconds: float = 0.0
    """Wall time of the whole run, lab included."""

    @property
    def claims_lost(self) -> int:
        return sum(count - 1 for count in self.claims.values() if count > 1)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["claims"] = {str(rank): count for rank, count in self.claims.items()}
        data["exited"] = {str(rank): code for rank, code in self.exited.items()}
        data["claims_lost"] = self.claims_lost
        return data


async def run_etcd_fault(
    fault: str,
    *,
    duration: float,
    start_after: float = 2.0,
    ttl: int = 5,
    workdir: Path | None = None,
    lab_ready: Callable[[Lab], None] | None = None,
) -> FaultRun:
    """Run ``fault`` in a new lab and measure it (``lab_ready`` is called with the lab
    once it is built, e.g. to tell a load sampler its namespaces).

    Raises:
        ValueError: an unknown fault.
        trio.TooSlowError: the mesh did not form, or a step overran its bound.
    """
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}; got {fault!r}")
    began = time.monotonic()
    run = FaultRun(fault, duration, start_after, ttl)
    with trio.fail_after(duration + 180):
        async with open_lab(PODS, workdir=workdir, etcd_members=3) as lab:
            assert lab.etcd_cluster is not None
            if lab_ready is not None:
                lab_ready(lab)
            mesh = await _form_mesh(MeshLab.create(lab, ttl=ttl))
            run.etcd_version = await lab.etcd_cluster.version()
            prepare, begin, end = _FAULTS[fault]
            if prepare is not None:
                await prepare(lab.etcd_cluster)
            fault_at = time.monotonic()
            target = await begin(lab.etcd_cluster)
            await trio.sleep(start_after)
            stopped_at = time.monotonic()
            await lab.kill_pod(mesh.pod(STOPPED))
            await mesh.start_rank(STARTED)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_measure_reach, mesh, run, fault_at)
                nursery.start_soon(_measure_drop, mesh, run, stopped_at)
            await trio.sleep(max(0.0, fault_at + duration - time.monotonic()))
            ended_at = time.time()  # the daemons' log times are wall clock
            await end(lab.etcd_cluster, target)
            await lab.etcd_cluster.wait_healthy()
            until = time.monotonic()
            await trio.sleep(MISS_AFTER + 0.5)
            _count(mesh, run, fault_at, stopped_at, until)
            run.claim_losses = [
                loss
                for rank, daemon in sorted(mesh.daemons.items())
                if rank != STOPPED
                for loss in claim_losses(rank, daemon.log_text(), ended_at)
            ]
    run.seconds = time.monotonic() - began
    return run


async def _form_mesh(mesh: MeshLab) -> MeshLab:
    await mesh.start_probes(report_every=1.0)
    for rank in range(STARTED):
        await mesh.start_rank(rank)
    await mesh.wait_full_mesh(FORM_TIMEOUT, set(range(STARTED)))
    return mesh


async def _measure_reach(mesh: MeshLab, run: FaultRun, fault_at: float) -> None:
    ranks = {*KEPT, STARTED}
    await mesh.wait_full_mesh(FORM_TIMEOUT, ranks)
    reached = mesh.first_reached()
    last = max(reached[(a, b)] for a in ranks for b in ranks if a != b and STARTED in (a, b))
    run.reached_after_start = last - mesh.started_at[STARTED]
    run.reached_after_fault = last - fault_at


async def _measure_drop(mesh: MeshLab, run: FaultRun, stopped_at: float) -> None:
    with trio.fail_after(run.ttl + FORM_TIMEOUT):
        while True:
            holders = [rank for rank in sorted(KEPT) if STOPPED in await mesh.device_ranks(rank)]
            if not holders:
                run.dropped_after_stop = time.monotonic() - stopped_at
                return
            await trio.sleep(0.1)


def _count(mesh: MeshLab, run: FaultRun, fault_at: float, stopped_at: float, until: float) -> None:
    lost = mesh.probe_misses(fault_at, until, set(KEPT))
    run.probes_lost = {f"{a}->{b}": n for (a, b), n in sorted(lost.items())}
    before = mesh.probe_misses(fault_at, stopped_at - MISS_AFTER, {*KEPT, STOPPED})
    run.probes_lost_before_stop = sum(before.values())
    replies = mesh.probe_received(fault_at, until, set(KEPT))
    run.fewest_replies = min(replies.values(), default=0)
    for rank, daemon in sorted(mesh.daemons.items()):
        log = daemon.log_text()
        if rank != STOPPED:
            run.claims[rank] = len(re.findall(r"claimed rank \d+ as", log))
            if daemon.returncode is not None:
                run.exited[rank] = daemon.returncode
        run.watch_moves += log.count("; resumed on ")
        run.outages += log.count("registry unreachable during")


_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) .*?(claiming rank \d+ again|claimed rank \d+ as)",
    re.MULTILINE,
)


def claim_losses(rank: int, log: str, ended_at: float) -> list[ClaimLoss]:
    """The claims lost in one daemon's ``log``, timed from ``ended_at`` (epoch seconds)."""
    losses: list[ClaimLoss] = []
    lost_at: float | None = None
    for stamp, what in _LOG_LINE.findall(log):
        at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # local, as logged
        if what.startswith("claiming"):
            if lost_at is not None:
                losses.append(ClaimLoss(rank, lost_at - ended_at, float("nan")))
            lost_at = at
        elif lost_at is not None:
            losses.append(ClaimLoss(rank, lost_at - ended_at, at - lost_at))
            lost_at = None
    if lost_at is not None:
        losses.append(ClaimLoss(rank, lost_at - ended_at, float("nan")))
    return losses


async def _follower_first(cluster: EtcdCluster) -> None:
    """Leadership off member 0, so that freezing it freezes a follower."""
    if await cluster.leader() == 0:
        await cluster.move_leader(1)


async def _leader_first(cluster: EtcdCluster) -> None:
    await cluster.move_leader(0)


async def _kill_leader(cluster: EtcdCluster) -> int:
    leader = await cluster.leader()
    await cluster.kill(leader)
    return leader


async def _freeze(cluster: EtcdCluster) -> int:
    cluster.freeze(0)
    return 0


async def _thaw(cluster: EtcdCluster, index: int) -> None:
    cluster.thaw(index)


async def _partition(cluster: EtcdCluster) -> int:
    await cluster.partition(0)
    return 0


async def _stop_first(cluster: EtcdCluster) -> int:
    await cluster.stop(0)
    return 0


async def _roll_on(cluster: EtcdCluster, index: int) -> None:
    await cluster.restart(index)
    for other in range(1, len(cluster.members)):
        await cluster.wait_healthy()
        await cluster.stop(other)
        await trio.sleep(RESTART_PAUSE)
        await cluster.restart(other)


async def _remove_first(cluster: EtcdCluster) -> int:
    await cluster.remove(0)
    return 0


Prepare = Callable[[EtcdCluster], Awaitable[None]]
Begin = Callable[[EtcdCluster], Awaitable[int]]
End = Callable[[EtcdCluster, int], Awaitable[None]]

_FAULTS: dict[str, tuple[Prepare | None, Begin, End]] = {
    "leader-killed": (None, _kill_leader, EtcdCluster.restart),
    "frozen": (_follower_first, _freeze, _thaw),
    "frozen-leader": (_leader_first, _freeze, _thaw),
    "partitioned": (None, _partition, EtcdCluster.heal),
    "rolling-restart": (None, _stop_first, _roll_on),
    "replaced": (None, _remove_first, EtcdCluster.add_fresh),
}
