"""``vnetd doctor``'s run: one list of the members, every daemon's row, the verdicts.

The I/O around ``vnetd.doctor.cause``: the registry is read once (and, when
ranks are missing, asked whether it takes writes: ``control.write_probe``, so a
full registry is named as their cause), the probe services are asked over the
overlay (``CONNECTIONS`` at a time), and the whole run stays inside ``--timeout``.
A foreign service-mesh sidecar in the pod it runs in (``doctor.sidecars``) is a note.
A progress line goes to stderr on long runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

import trio

from vnetd.commands.doctor.plan import DoctorPlan
from vnetd.control.membership import read_members
from vnetd.control.write_probe import writes_refused
from vnetd.daemon.probe_echo import ECHO_WAIT
from vnetd.daemon.probe_service import ask_row
from vnetd.doctor.cause import Evidence, classify
from vnetd.doctor.evidence import Row, merge_rows
from vnetd.doctor.report import Run, document, text
from vnetd.doctor.sidecars import proxy_lines
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.observe.gate import read_proc_tables
from vnetd.registry import RegistryOpener
from vnetd.status.view import registry_full_note

CONNECTIONS = 128
"""Probe services asked at once: each row runs on its own daemon, so the run takes
ceil(N / CONNECTIONS) rows' time (16 at 1024 ranks with 64 at once, 8 with 128)."""
ROW_DEADLINE = 9.0
"""What each service is given for its row (s): its echoes take up to 4.5 s, 7.3 s with
bisection (``vnetd.daemon.probe_echo``), and it keeps 1 s for its device and its answer."""
SLACK = 2.0
"""Kept back from ``--timeout`` for the verdicts and the output (s)."""
PROGRESS_AFTER = 2.0
SECOND_PASS_MIN = ECHO_WAIT + 1.5
"""Time left (s) below which the failing pairs are not probed a second time: a row with
a failing pair takes ``ECHO_WAIT``, and its answer must come back in what is left."""


async def doctor(
    plan: DoctorPlan,
    *,
    open_registry: RegistryOpener | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the doctor; returns 0 (all pairs good) or 1 (some pair fails).

    Raises:
        RegistryUnavailable: the members could not be read (exit 2).
    """
    if open_registry is None:
        from vnetd.registry import open_registry as open_settings_registry

        open_registry = open_settings_registry
    out, err = out or sys.stdout, err or sys.stderr
    started = time.monotonic()
    spec = plan.spec
    deadline = trio.current_time() + plan.timeout - SLACK
    async with open_registry(spec.registry) as registry:
        with trio.move_on_at(deadline - ROW_DEADLINE) as scope:
            members, _bad = await read_members(registry, spec)
        if scope.cancelled_caught:
            raise RegistryUnavailable(
                f"reading the members of mesh {spec.name}: no answer within "
                f"{plan.timeout - SLACK - ROW_DEADLINE:g} s; check --etcd or raise --timeout"
            )
        # Ranks missing: could they claim at all? (One lease grant, revoked at once.)
        full = None
        if len(members) < spec.size:
            full = await writes_refused(registry, spec.registry.lease_ttl)
    ranks = tuple(sorted(members))
    asks = {rank: ranks for rank in ranks}
    rows = await ask_all(plan, asks, deadline, _progress(err, started, len(asks)))
    again = failed_pairs(rows, members, asks)
    if again and deadline - trio.current_time() > SECOND_PASS_MIN:
        # Only the failing pairs, once more: on a loaded host an echo can be lost, and
        # this pass is light. A pair that passes in either is good (a reply is proof);
        # one that fails in both is judged on the second's evidence.
        second = await ask_all(plan, again, deadline, _progress(err, started, len(again)))
        rows = merge_passes(rows, second)
    notes = []
    if members and not rows:
        notes.append(
            "no probe service answered: run vnetd doctor inside a pod of the mesh "
            f"(it reaches the daemons over the overlay, port {spec.doctor_port})"
        )
    if full is not None:
        notes.append(registry_full_note(full))
    # A service mesh's sidecar beside this pod's daemon: Flux's TCP on the overlay breaks.
    notes += proxy_lines(await trio.to_thread.run_sync(read_proc_tables), spec.interface)
    evidence = Evidence(spec, members, rows, full)
    verdicts = tuple(
        classify(evidence, a, b) for a in range(spec.size) for b in range(spec.size) if a != b
    )
    result = Run(
        spec.name,
        spec.size,
        tuple(sorted(members)),
        tuple(sorted(rows)),
        verdicts,
        time.monotonic() - started,
        tuple(notes),
    )
    if plan.json:
        out.write(json.dumps(document(result), indent=1) + "\n")
    else:
        out.write(text(result))
    return 0 if result.ok else 1


def merge_passes(first: Mapping[int, Row], second: Mapping[int, Row]) -> dict[int, Row]:
    """The rows of both passes: a rank in both gets ``merge_rows``; one whose row came
    only in the second (it was asked again because its first did not come) keeps it."""
    merged = {rank: merge_rows(row, second.get(rank)) for rank, row in first.items()}
    return merged | {rank: row for rank, row in second.items() if rank not in first}


def failed_pairs(
    rows: Mapping[int, Row], members: Mapping[int, Member], asks: Mapping[int, tuple[int, ...]]
) -> dict[int, tuple[int, ...]]:
    """For each row, the registered ranks whose echoes did not all pass; for each rank
    asked whose row did not come (a loaded daemon's may be late), all it was asked."""
    again = {rank: targets for rank, targets in asks.items() if rank not in rows}
    for rank, row in rows.items():
        targets = tuple(
            target
            for target, seen in sorted(row.peers.items())
            if target in members and (seen.small_rtt is None or seen.full_rtt is None)
        )
        if targets:
            again[rank] = targets
    return again


async def ask_all(
    plan: DoctorPlan,
    asks: Mapping[int, tuple[int, ...]],
    deadline: float,
    progress: Callable[[int], None],
) -> dict[int, Row]:
    """The row of each rank in ``asks`` (about the ranks it maps to) that arrives by
    ``deadline``."""
    rows: dict[int, Row] = {}
    limit = trio.Semaphore(CONNECTIONS)

    async def one(rank: int) -> None:
        async with limit:
            budget = deadline - trio.current_time()
            if budget <= 0:
                return
            row = await ask(plan, rank, asks[rank], min(ROW_DEADLINE, max(2.0, budget - 2.0)))
            if row is not None and row.rank == rank:
                rows[rank] = row
            progress(len(rows))

    with trio.move_on_at(deadline):
        async with trio.open_nursery() as nursery:
            for rank in sorted(asks):
                nursery.start_soon(one, rank)
    progress(-1)
    return rows


async def ask(plan: DoctorPlan, rank: int, ranks: tuple[int, ...], budget: float) -> Row | None:
    """One rank's row from its probe service, or None (``probe_service.ask_row``)."""
    return await ask_row(plan.spec, rank, ranks, budget)


def _progress(err: TextIO, started: float, total: int) -> Callable[[int], None]:
    """A progress reporter: one line per second on stderr once the run is long."""
    last = [0.0]

    def report(done: int) -> None:
        now = time.monotonic()
        if done < 0:
            if last[0]:
                err.write("\n" if err.isatty() else "")
            return
        if now - started < PROGRESS_AFTER or now - last[0] < 1.0:
            return
        last[0] = now
        line = f"vnetd doctor: {done}/{total} rows, {now - started:.0f} s"
        err.write(("\r" + line) if err.isatty() else line + "\n")
        err.flush()

    return report
