#!/usr/bin/env python3
"""An MPI job's first all-to-all: ranks start in a random order (rank 0 last), then all send.

For each cluster size N, each run builds a netns lab (one real etcd; per pod
one ``vnetd up``, its wireguard-go, and ``bench/first_contact.py``) and
starts the N ranks in a random order with rank 0 last, with random gaps
(uniform 0..``--max-gap`` s), as a launcher starts a job's pods. The probers
run from the start but hold their fire (``--go-file``); right after the last
start (rank 0's) the go file appears and every rank sends to every other
at once, each retrying a target every ``--interval`` s until it answers
(every ``--unrouted-interval`` s while the kernel has no route to it yet).

The figure is the time from the last start until every ordered pair has
answered (a packet went each way over the overlay); also each pair's time
(the slowest pair, how many needed over 1 s and over 2 s), each pair's time
from when both its ends were ready and its sender's prober had started
sending (the handshake without the start-up), and the time from the last
daemon's readiness (its ``claimed rank`` log line). All
times are ``time.monotonic()``; daemon log times (the JSON ``time``) are
converted with ``common.ClockMap``.

With ``--tree-fanout K`` the mesh pins ``[mesh] tree_fanout = K`` (pairs off the
jobs' K-ary tree handshake on their first packet, issue 46). With ``--paired K``
every run is two labs back to back, one per arm (eager, then ``tree_fanout = K``,
the first arm alternating from run to run), started in the same order with the
same gaps: the two arms then differ in the arm and in the host's noise of a few
seconds apart, not in the schedule, and a drift of the host over the minutes of
a bench falls on both arms alike.

Writes ``all_to_all.json`` (eager) and ``all_to_all_lazy.json`` (``tree_fanout``).
Run alone: ``.venv/bin/python bench/all_to_all.py --sizes 8 --runs 1``; with
``--trace-dir DIR`` the per-pod logs are kept (``bench/traces.py``).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    ClockMap,
    JsonMesh,
    LoadSampler,
    base_parser,
    check_host,
    claim_time,
    lab_netns,
    latency,
    merge_load,
    run_each_size,
    runs_for,
    seeded,
    spread,
    spreads,
    summary_by_size,
    wait_for,
    write_result,
)
from traces import add_trace_option, keep_traces, start_tracing

from vnetd.lab.cluster import http_get
from vnetd.lab.open_lab import open_lab
from vnetd.lab.probe import parse_events
from vnetd.spec import load_spec

PROBE_DURATION = 600.0
METRICS = "127.0.0.1:9109"
"""Each daemon's metrics, on its pod's loopback (handshakes it started)."""
OVER = (1.0, 2.0)
"""Pair times counted: how many ordered pairs needed more than each (s)."""


async def start_probers(mesh: JsonMesh, size: int, go_file: Path, args: Any) -> None:  # noqa: ANN401
    targets = ",".join(mesh.address(r) for r in range(size))
    for rank in range(size):
        argv = [sys.executable, str(BENCH / "first_contact.py"), "--self-addr", mesh.address(rank),
                "--targets", targets, "--interval", str(args.interval),
                "--unrouted-interval", str(args.unrouted_interval),
                "--duration", str(PROBE_DURATION), "--go-file", str(go_file)]  # fmt: skip
        mesh.probes[rank] = await mesh.lab.start(mesh.pod(rank), argv, private_mount=False)
    await wait_for(
        lambda: all('"started"' in p.log_text() for p in mesh.probes.values()),
        "every prober started",
        60,
        0.2,
    )


async def handshakes_started(mesh: JsonMesh, rank: int) -> float:
    """``vnetd_handshakes_initiated_total`` of ``rank``'s daemon (None: not served)."""
    status, body = await http_get(mesh.lab, mesh.pod(rank), f"http://{METRICS}/metrics")
    found = re.search(r"^vnetd_handshakes_initiated_total (\S+)$", body, re.M)
    return float(found.group(1)) if status == 200 and found else math.nan


def go_time(mesh: JsonMesh, rank: int) -> float:
    """When ``rank``'s prober saw the go file (monotonic)."""
    events = parse_events(mesh.probes[rank].log_text())
    return next(float(e["t"]) for e in events if e.get("event") == "go")


def schedule(size: int, rng: Any, max_gap: float) -> tuple[list[int], list[float]]:  # noqa: ANN401
    """A start order (rank 0 last) and the gaps between the starts."""
    order = list(range(1, size))
    rng.shuffle(order)
    return [*order, 0], [rng.uniform(0, max_gap) for _ in range(size - 1)]


async def one_run(
    size: int,
    run: int,
    starts: tuple[list[int], list[float]],
    tree_fanout: int,
    args: Any,  # noqa: ANN401
) -> JSON:
    clock = ClockMap()
    order, gaps = starts
    async with open_lab(size, static_neighbours=True) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            mesh = JsonMesh.create(lab)
            if tree_fanout:
                text = mesh.spec_path.read_text()
                mesh.spec_path.write_text(
                    text.replace("[mesh]\n", f"[mesh]\ntree_fanout = {tree_fanout}\n", 1)
                )
                mesh.spec = load_spec(mesh.spec_path)
            go_file = lab.workdir / "go"
            await start_probers(mesh, size, go_file, args)
            for i, rank in enumerate(order):
                await mesh.start_rank(rank, "--http-listen", METRICS)
                if i < size - 1:
                    await trio.sleep(gaps[i])
            go_file.touch()
            last_start = mesh.started_at[0]
            full_at = await mesh.wait_full_mesh(args.window, set(range(size)))
            await wait_for(
                lambda: all(claim_time(mesh.log(r), r) for r in range(size)), "every claim", 30
            )
            ready = {r: clock.to_monotonic(claim_time(mesh.log(r), r) or 0.0) for r in range(size)}
            reached = mesh.first_reached()
            go = {r: go_time(mesh, r) for r in range(size)}
            started = [await handshakes_started(mesh, r) for r in range(size)]
            label = f"all_to_all{'_lazy' if tree_fanout else ''}-{size}-{run + 1}"
            await keep_traces(mesh, args.trace_dir, label, reached, clock, go)
            nursery.cancel_scope.cancel()
    waits = {pair: t - last_start for pair, t in reached.items()}
    # From when both ends were ready and the sender's prober had its go (a pair of early
    # ranks is ready long before the last start).
    after_ready = {(a, b): t - max(ready[a], ready[b], go[a]) for (a, b), t in reached.items()}
    slowest = sorted(waits.items(), key=lambda item: -item[1])[:5]
    result: JSON = {
        "size": size,
        "order": order,
        "from_last_start": full_at - last_start,
        "from_last_ready": full_at - max(ready.values()),
        "start_span": last_start - min(mesh.started_at.values()),
        "rank0_start_to_ready": ready[0] - last_start,
        "pair_s": latency(list(waits.values())),
        "pair_after_both_ready_s": latency(list(after_ready.values())),
        "over_s": {f"{limit:g}": sum(1 for w in waits.values() if w > limit) for limit in OVER},
        "slowest": [
            {
                "pair": f"{a}>{b}",
                "s": round(w, 4),
                "after_both_ready_s": round(after_ready[(a, b)], 4),
            }
            for (a, b), w in slowest
        ],  # fmt: skip
        "tree_fanout": tree_fanout,
        "handshakes_started": sum(started),
        "handshake_bound": size * (tree_fanout + 2) if tree_fanout else None,
        "load": sampler.summary(),
    }
    print(
        f"  size {size}: every pair answered {result['from_last_start']:.2f} s after the last "
        f"start ({result['from_last_ready']:.2f} s after the last readiness; starts over "
        f"{result['start_span']:.1f} s); slowest pair {slowest[0][0]} {slowest[0][1]:.2f} s; "
        f"pairs over 1 s: {result['over_s']['1']}, over 2 s: {result['over_s']['2']} of "
        f"{len(waits)}; handshakes started by the daemons {result['handshakes_started']:g} "
        f"(tree_fanout {tree_fanout}); CPU busy {result['load']['cpu_busy_mean'] or 0:.0%}, "
        f"load {result['load']['loadavg_max'] or 0:.1f}",
        flush=True,
    )
    return result


def figures(size: int, mine: list[JSON]) -> JSON:
    """One size's row of the summary, from its runs."""
    return {
        **spreads(mine, "from_last_start", "from_last_ready", "rank0_start_to_ready"),
        "slowest_pair": spread(r["pair_s"]["max"] for r in mine),
        "slowest_after_both_ready": spread(r["pair_after_both_ready_s"]["max"] for r in mine),
        "pair_p50": spread(r["pair_s"]["p50"] for r in mine),
        "over_1s": spread(r["over_s"]["1"] for r in mine),
        "over_2s": spread(r["over_s"]["2"] for r in mine),
        "pairs": size * (size - 1),
        "handshakes_started": spread(r.get("handshakes_started") for r in mine),
        "handshake_bound": mine[0].get("handshake_bound") if mine else None,
    }


def summarize(runs: list[JSON], sizes: list[int]) -> JSON:
    return {"by_size": summary_by_size(runs, sizes, figures), "target_s": 2.0, "target_size": 24}


async def paired_run(size: int, run: int, rng: Any, args: Any) -> JSON:  # noqa: ANN401
    """Both arms on one schedule, back to back; the first arm alternates by run."""
    starts = schedule(size, rng, args.max_gap)
    arms = (0, args.paired) if run % 2 == 0 else (args.paired, 0)
    done = {fanout: await one_run(size, run, starts, fanout, args) for fanout in arms}
    return {"size": size, "eager": done[0], "lazy": done[args.paired], "first": arms[0]}


async def main_async(args: Any) -> int:  # noqa: ANN401
    seed, rng = seeded(args.seed)
    start_tracing(args.trace_dir)
    if args.paired:
        pairs, failures = await run_each_size(
            "all_to_all", args.sizes, args.runs, lambda size, i: paired_run(size, i, rng, args)
        )
        arms = {0: [p["eager"] for p in pairs], args.paired: [p["lazy"] for p in pairs]}
    else:
        fanout = args.tree_fanout
        runs, failures = await run_each_size(
            "all_to_all", args.sizes, args.runs,
            lambda size, i: one_run(size, i, schedule(size, rng, args.max_gap), fanout, args),
        )  # fmt: skip
        arms = {fanout: runs}
    for fanout, runs in arms.items():
        params = {"sizes": args.sizes,
                  "runs": {size: runs_for(args.runs, size) for size in args.sizes},
                  "seed": seed, "max_gap_s": args.max_gap, "probe_interval_s": args.interval,
                  "unrouted_interval_s": args.unrouted_interval, "lease_ttl_s": 5,
                  "tree_fanout": fanout, "paired": bool(args.paired),
                  "wireguard_log": "verbose" if args.trace_dir else "error"}  # fmt: skip
        # The lazy arm (issue 46) is a result of its own beside the eager one.
        name = "all_to_all_lazy" if fanout else "all_to_all"
        write_result(name, "First all-to-all after the last start", params, runs,
                     summarize(runs, args.sizes), merge_load([r["load"] for r in runs]),
                     args.out, failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(24,), runs=3)
    parser.add_argument("--max-gap", type=float, default=0.2, help="start gaps 0..S (0.2)")
    parser.add_argument("--interval", type=float, default=0.05, help="probe interval (0.05 s)")
    parser.add_argument("--unrouted-interval", type=float, default=0.05,
                        help="retry of a target not routed yet (0.05 s)")  # fmt: skip
    parser.add_argument("--window", type=float, default=120, help="give up after S s (120)")
    parser.add_argument(
        "--tree-fanout",
        type=int,
        default=0,
        help="[mesh] tree_fanout K: pairs off the tree lazy (0: off)",
    )
    parser.add_argument("--paired", type=int, default=0, metavar="K",
                        help="each run twice on one start schedule, eager and tree_fanout K "
                        "(first arm alternating); writes both results")  # fmt: skip
    add_trace_option(parser)
    args = parser.parse_args()
    check_host()
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
