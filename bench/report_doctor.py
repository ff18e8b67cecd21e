"""The ``doctor`` section of docs/benchmarks.md (bench/doctor.py's result)."""

from __future__ import annotations

import math

from common import JSON
from report_format import table

from vnetd.commands.doctor.gather import CONNECTIONS, ROW_DEADLINE
from vnetd.daemon.probe_service import START_GAP

PROBE_CPU = 0.0003
"""A probe's own CPU on its daemon (s): a socket, two datagrams, a task (an estimate)."""
UAPI_GET_1000 = 0.0034
"""One UAPI ``get`` with 1000 peers (s, measured here); a row reads the device twice."""
CLASSIFY_PER_PAIR = 11e-6
"""``cause.classify`` per ordered pair (s): 0.7 s for 256 ranks, measured in review."""
DECODE_PER_PAIR = 2.5e-6
"""Decoding one pair's ~250 bytes of row JSON in the doctor (s, at ~100 MB/s)."""


def projected_run_s(size: int) -> float:
    """A healthy run's time on a cluster (each daemon on its own cores): the rows in
    ``ceil(N / CONNECTIONS)`` waves, then the rows decoded and every pair classified."""
    row = (size - 1) * (START_GAP + PROBE_CPU) + 2 * UAPI_GET_1000 * size / 1000 + 0.005
    pairs = size * (size - 1)
    return math.ceil(size / CONNECTIONS) * row + pairs * (CLASSIFY_PER_PAIR + DECODE_PER_PAIR)


def _load(load: float | None) -> str:
    return "—" if load is None else f"{load:.1f}"


def doctor_section(r: JSON | None) -> list[str]:
    out = ["## vnetd doctor: wall time and registry cost", ""]
    if r is None:
        return out + ["Not measured (run `bench/doctor.py`).", ""]
    rows = []
    for run in r["runs"]:
        during, idle = run["registry_during"], run["registry_idle_same_span"]
        causes = ", ".join(f"{c} {n}" for c, n in sorted(run["causes"].items())) or "none"
        rows.append([
            str(run["size"]), f"{run['wall_s']:.2f}", f"{run['elapsed_s']:.2f}",
            f"{run['working']}/{run['size'] * (run['size'] - 1)}", causes,
            f"{during['range']:.0f} ({idle['range']:.0f})",
            f"{during['cpu_s']:.2f} ({idle['cpu_s']:.2f})", _load(run.get("load_1m")),
        ])  # fmt: skip
    projection = [[str(n), f"{projected_run_s(n):.1f}"] for n in (64, 256, 1024)]
    return out + [
        "`vnetd doctor --json` in pod 0 of a formed mesh (one real etcd, neighbours pinned);",
        "etcd's /metrics scraped just before and after the run, and over an idle window of",
        "the same length after it (in parentheses: the daemons' own lease keepalives and",
        "reads). *wall*: the doctor process from start to exit (Python start-up included);",
        "*run*: its own `elapsed_s` (registry list, rows, verdicts).",
        "",
        *table(
            [
                "ranks",
                "wall s",
                "run s",
                "pairs working",
                "failing, by cause",
                "etcd ranges (idle)",
                "etcd CPU s (idle)",
                "load",
            ],
            rows,
        ),  # fmt: skip
        "The doctor's own registry cost is one list of the members, 2 ranges (two pages);",
        "at 8 and 32 ranks that was all a run cost, and the idle window after it had none",
        "(the daemons' watches get progress notifications, so at rest they read nothing).",
        "At 64 ranks etcd also served the daemons' own reads, 20 ranges during the run and",
        "4 in the idle window after it: quiet checks and watch restarts of daemons on a",
        "host at load ~200. A check whose timer fired late now first waits for what its",
        "stream queued meanwhile (`tests/e2e/test_quiet_watch.py`: a daemon stalled 4.5 s",
        "cost one range before, none after); the page's earlier run, before that change and",
        "at load 24-40, counted 17 and 66 at 32 and 64 ranks. At rest the doctor costs",
        "nothing (no key, no watch, no traffic).",
        "",
        "*load* is the 1-minute load average when the doctor started. The 64-rank lab's own",
        "64 Python daemons and their wireguard-go on 2 cores drive it far up while the mesh",
        "forms (254 s in the run shown, load ~200 with two other engineers' work on the",
        "machine; 632 s and ~120 in the page's earlier run, 8 pairs then still missing to",
        "the lab's probes), so the 64-rank wall time is an upper bound for a cluster.",
        "Earlier runs on a machine shared with other labs (load 90-150) never formed the",
        "64-rank mesh; one at load ~100, before the rows came in waves of 128, took 17.8 s",
        "wall with 36 of 64 rows",
        "answered. A failing pair here is the",
        "mesh's state as the doctor saw it: a rank whose daemon had exited",
        "(`not_registered`) or a probe service too loaded to answer its row within "
        f"{ROW_DEADLINE:g} s,",
        "asked twice (`no_answer`). Before the fix of this round a healthy 32-rank mesh",
        "came out with 895 of 992 pairs failing, named",
        "`no_data`: the lab's pods share the kernel's one neighbour table (1024 entries),",
        "which the doctor's burst overflowed (11,018 overflows and 10,858 failed UDP sends",
        "during one run, counted). The lab now pins its neighbours; the doctor spreads its",
        "echoes, counts late answers, and names a loss on an overloaded daemon `overloaded`.",
        "",
        "Projected healthy run on a cluster (each daemon on its own cores; not measured):",
        f"rows in waves of {CONNECTIONS}, each row {START_GAP * 1000:.1f} ms per probe's "
        "start plus ~0.3 ms of",
        "its CPU and two device reads, then every row decoded and every pair classified",
        "(11 µs per pair, measured in review).",
        "",
        *table(["ranks", "projected run s"], projection),
    ]
