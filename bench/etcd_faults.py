#!/usr/bin/env python3
"""etcd cluster faults: what a killed, frozen or partitioned member costs the mesh.

Each run is ``vnetd.lab.etcd_faults.run_etcd_fault``: five pods, three etcd
3.4 members, real wireguard-go, ranks 0-3 meshed, every daemon given all
three endpoints. The fault starts; rank 4 is started ``--start-after`` s
later (0: at the fault) and rank 3's pod killed; the fault lasts
``--duration`` s (30 s: the issue's figure). Figures per run:

* ``reached_after_fault``: the fault's start → rank 4 and every kept rank
  have reached each other over the overlay (``reached_after_start``: from
  rank 4's own start);
* ``claims_lost``: claims made again after a lost lease (target 0);
* probes lost between the ranks meshed before (target 0), ``dropped_after_stop``.

With ``--watch-cost N`` it measures instead what keeping N member watches
healthy costs etcd (bench/watch_load.py, one real etcd): etcd CPU per second
over ``--window`` s with N plain watches, N leader-required watches
(``Grpc-Metadata-Hasleader``), and N watches as ``EtcdRegistry`` keeps them
(leader-required, and a linearizable read on the member of each quiet watch
whenever it has been quiet for its quiet check), and with a serializable read
instead; and etcd's requests per second at rest for each (gRPC messages
received, ``bench/etcd_metrics.py``). The prefix holds N member keys first
(the watches' own mesh; ``--members M``: M keys, so N watches stand for N of
an M-member mesh), put by the first pod's load; ``--modes`` picks the
modes. The lab's etcd sends progress notifications every 2 s;
``VNETD_LAB_ETCD_PROGRESS=off`` measures an etcd left at its default.

    .venv/bin/python bench/etcd_faults.py --faults frozen --runs 1
    .venv/bin/python bench/etcd_faults.py --watch-cost 1024
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    base_parser,
    check_host,
    proc_cpu_seconds,
    run_repeated,
    spread,
    write_result,
)
from control_plane import events, rates

from vnetd.lab.etcd import PROGRESS_INTERVAL
from vnetd.lab.etcd_faults import FAULTS, run_etcd_fault
from vnetd.lab.open_lab import open_lab

NAME = "etcd_faults"
TITLE = "etcd cluster faults (3 members)"
WATCH_NAME = "etcd_watch_cost"
WATCH_TITLE = "What keeping member watches healthy costs etcd"
BENCH_FAULTS = ("leader-killed", "frozen", "partitioned")
WATCHERS_PER_POD = 256
READY_WITHIN = 300.0
"""Seconds a mode's watches may take to open. A load's own ``--duration`` counts from
its start, so it covers this too: with only the window in it, the 256 checked
watches of pod 0 (which first puts the 1024 members) after the plain and leader
modes were not all open when it ran out, and the load exited without a word."""
WATCH_MODES = ("plain", "leader", "checked", "serializable")


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], sizes=[5], runs=1)
    parser.add_argument(
        "--faults",
        type=lambda text: [f for f in text.split(",") if f],
        default=list(BENCH_FAULTS),
        help=f"comma-separated, of {', '.join(FAULTS)} (default {','.join(BENCH_FAULTS)})",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="fault length, s")
    parser.add_argument("--start-after", type=float, default=0.0, help="rank 4 start, s")
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL, s (default 5)")
    parser.add_argument("--watch-cost", type=int, default=0, metavar="N", help="watchers")
    parser.add_argument("--window", type=float, default=30.0, help="watch-cost window, s")
    parser.add_argument("--members", type=int, default=0,
                        help="member keys under the prefix (default: the watchers)")  # fmt: skip
    parser.add_argument("--modes", default=",".join(WATCH_MODES),
                        help="watch-cost modes, comma-separated (default all)")  # fmt: skip
    return parser.parse_args()


async def faults(args: argparse.Namespace) -> None:
    sampler = LoadSampler()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler.run)
        await _faults(args, sampler)
        nursery.cancel_scope.cancel()


async def _faults(args: argparse.Namespace, sampler: LoadSampler) -> None:
    runs: list[JSON] = []
    failures: list[JSON] = []
    summary: JSON = {}
    for fault in args.faults:

        async def one(_: int, fault: str = fault) -> JSON:
            run = await run_etcd_fault(
                fault,
                duration=args.duration,
                start_after=args.start_after,
                ttl=args.ttl,
                lab_ready=lambda lab: sampler.own_netns.update(lab.netns_names),
            )
            print(
                f"  {fault}: reached by all {run.reached_after_fault:.2f} s after the fault, "
                f"claims lost {run.claims_lost}, probes lost {sum(run.probes_lost.values())}",
                flush=True,
            )
            return run.as_json()

        done, failed = await run_repeated(fault, args.runs.get(0, 1), one, {"fault": fault})
        runs += done
        failures += failed
        summary[fault] = {
            "reached_after_fault_s": spread(r["reached_after_fault"] for r in done),
            "reached_after_start_s": spread(r["reached_after_start"] for r in done),
            "dropped_after_stop_s": spread(r["dropped_after_stop"] for r in done),
            "claims_lost": sum(r["claims_lost"] for r in done),
            "probes_lost": sum(sum(r["probes_lost"].values()) for r in done),
        }
    params = {k: getattr(args, k) for k in ("faults", "duration", "start_after", "ttl")}
    write_result(NAME, TITLE, params, runs, summary, sampler.summary(), args.out, failures)


async def watch_cost(args: argparse.Namespace) -> None:
    """etcd CPU per second with N watches of each mode, one mode at a time."""
    n = args.watch_cost
    pods = max(1, -(-n // WATCHERS_PER_POD))
    runs: list[JSON] = []
    async with open_lab(pods) as lab, trio.open_nursery() as nursery:
        sampler = LoadSampler(own_netns=set(lab.netns_names))
        nursery.start_soon(sampler.run)
        etcd = lab.etcd
        assert etcd is not None
        scraper = await lab.start(
            lab.pods[0],
            [sys.executable, str(BENCH / "etcd_metrics.py"), "--url", lab.etcd_url,
             "--interval", "1", "--duration", "3600"],
            private_mount=False,
        )  # fmt: skip
        for mode in args.modes.split(","):
            loads = []
            for i, pod in enumerate(lab.pods):
                count = min(WATCHERS_PER_POD, n - i * WATCHERS_PER_POD)
                members = (args.members or n) if i == 0 else 0
                argv = [sys.executable, str(BENCH / "watch_load.py"), "--url", lab.etcd_url,
                        "--watchers", str(count), "--mode", mode, "--duration",
                        str(READY_WITHIN + args.window + 60),
                        "--members", str(members)]  # fmt: skip
                loads.append(await lab.start(pod, argv, private_mount=False))
            await _wait_ready(loads, timeout=READY_WITHIN)
            await trio.sleep(5)  # let the connections settle
            cpu0, t0, wall0 = proc_cpu_seconds(etcd.pid), time.monotonic(), time.time()
            await trio.sleep(args.window)
            cpu = (proc_cpu_seconds(etcd.pid) - cpu0) / (time.monotonic() - t0)
            await trio.sleep(1.5)  # the scrape after the window
            rest = rates(events(scraper), wall0, time.time() - 1.5)
            why = [line.split(": ", 1)[-1].split("; resumed")[0][:90]
                   for load in loads for line in load.log_text().splitlines()
                   if "; resumed on " in line]  # fmt: skip
            moves = len(why)
            if why:
                print(f"  moves: {sorted(set(why))[:5]}", flush=True)
            reopened = [line.removeprefix("reopened: ")[:120]
                        for load in loads for line in load.log_text().splitlines()
                        if line.startswith("reopened: ")]  # fmt: skip
            if reopened:
                print(f"  reopened: {sorted(set(reopened))[:3]}", flush=True)
            for load in loads:
                await load.stop()
            rps = rest.get("requests_per_s")
            print(f"  {n} {mode} watches: etcd CPU {cpu:.3f} s/s, {rps} req/s "
                  f"{rest.get('received_per_s')}, {moves} watch moves, {len(reopened)} "
                  "reopened", flush=True)  # fmt: skip
            runs.append({"mode": mode, "watchers": n, "etcd_cpu_per_s": cpu,
                         "requests_per_s": rps, "received_per_s": rest.get("received_per_s"),
                         "watch_moves": moves, "watch_reopens": len(reopened),
                         "progress_notify": PROGRESS_INTERVAL})  # fmt: skip
            await trio.sleep(3)
        await scraper.stop()
        nursery.cancel_scope.cancel()
    summary = {r["mode"]: r["etcd_cpu_per_s"] for r in runs}
    params = {"watchers": n, "members": args.members or n, "window_s": args.window,
              "pods": pods, "progress_notify": PROGRESS_INTERVAL}  # fmt: skip
    write_result(WATCH_NAME, WATCH_TITLE, params, runs, summary, sampler.summary(), args.out)


async def _wait_ready(loads: list[Any], timeout: float) -> None:  # noqa: ASYNC109
    with trio.fail_after(timeout):
        while not all("ready" in load.log_text() for load in loads):
            if any(load.returncode is not None for load in loads):
                raise RuntimeError(f"a watch load exited: {[x.log_text()[-500:] for x in loads]}")
            await trio.sleep(0.5)


def main() -> None:
    check_host(("ip", "unshare", "nsenter", "etcd", "etcdctl", "wireguard-go", "nft"))
    args = parse_args()
    trio.run(watch_cost if args.watch_cost else faults, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
