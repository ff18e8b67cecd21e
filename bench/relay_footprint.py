#!/usr/bin/env python3
"""A cache's footprint: one ``vnetd relay`` serving W daemons of an N-rank mesh.

    relay_footprint.py [--size 10000] [--watchers 100] [--updates 1000] [--rest 10]

One lab of two pods and etcd (3.4, its own namespace), etcd pinned to core 1 and
the relay (pod 1), the simulated daemons (pod 0) and this script on core 0
(``taskset``, as bench/watch_fanout.py does; it starts the relay the same way).
In order:

* an empty relay, started ``EMPTY_STARTS`` times: ``vnetd relay`` on a prefix
  with no member, its CPU until its /healthz answers (the median) and its RSS
  (the interpreter and the imports: the base the figures below are taken from);
* N member records (``register.py seed``: a claim's records, 100 a transaction)
  put under a fresh prefix, then a relay started on it: its CPU until /healthz answers (its
  one list of N) less the empty relay's median, and its RSS holding N less the empty
  one's; its CPU at rest over ``--rest`` s;
* W simulated daemons (``fanout_client.py watch --transport json --list``: the
  daemon's own ``EtcdRegistry``, one connection each) each list the N members
  from the relay, then each opens a watch on it: the relay's CPU for the W
  lists (and per record listed), its RSS holding W watches, its CPU at rest;
* ``--updates`` K of the records rewritten in etcd (32 in flight) while the W
  watchers hold: the relay's CPU from the first write until every watcher has
  all K, less its at-rest rate, per record forwarded (W × K), and its RSS.

The relay's CPU is its threads' schedstat (to the nanosecond); RSS and PSS
from /proc. The figures are the relay's own; what etcd spends to feed it is
bench/watch_fanout.py's.

Run alone: ``.venv/bin/python bench/relay_footprint.py --size 1000 --watchers 20``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    attempt,
    base_parser,
    check_host,
    proc_pss_kib,
    proc_rss_kib,
    runs_for,
    spread,
    write_result,
)
from etcd_transport import signal_go
from watch_fanout import (
    BENCH_CORE,
    CLIENT,
    ETCD_CORE,
    READY_TIMEOUT,
    RELAY_ARGV,
    Cache,
    arm_spec,
    pinned,
    start_relay,
    wait_line,
)

from vnetd.lab.open_lab import Lab, LabProcess, open_lab

NAME = "relay_footprint"
TITLE = "Footprint of one vnetd relay"
SIZE, WATCHERS, UPDATES = 10_000, 100, 1000
EMPTY_STARTS = 3
"""Empty relays started, whose median start CPU is taken off the full one's: a start's
imports vary by tens of ms, as much as the list of 10,000 costs."""


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], sizes=[SIZE], runs=1)
    parser.add_argument("--size", type=int, default=SIZE, help=f"members (default {SIZE})")
    parser.add_argument("--watchers", type=int, default=WATCHERS,
                        help=f"simulated daemons (default {WATCHERS})")  # fmt: skip
    parser.add_argument("--updates", type=int, default=UPDATES,
                        help=f"records rewritten while they hold (default {UPDATES})")  # fmt: skip
    parser.add_argument("--rest", type=float, default=10.0, help="at-rest windows, s")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on one step, s")
    return parser.parse_args()


def memory(cache: Cache) -> JSON:
    pid = cache.process.pid
    return {"rss_mib": round(proc_rss_kib(pid) / 1024, 2),
            "pss_mib": round(proc_pss_kib(pid) / 1024, 2)}  # fmt: skip


async def started(lab: Lab, name: str, size: int) -> tuple[Cache, float, str, Path]:
    """A relay on the arm ``name``'s prefix, with its CPU until /healthz answered."""
    config, prefix = arm_spec(lab, name, size)
    cache = await start_relay(lab, list(RELAY_ARGV), config)
    return cache, cache.cpu, prefix, config


async def rest_share(cache: Cache, seconds: float) -> float:
    """The relay's CPU share of a core over ``seconds`` with nothing changing."""
    t0, c0 = time.monotonic(), cache.cpu
    await trio.sleep(seconds)
    return (cache.cpu - c0) / (time.monotonic() - t0)


async def put(lab: Lab, prefix: str, count: int, timeout: float) -> JSON:  # noqa: ASYNC109
    """``count`` member records under ``prefix`` (ranks 0..count-1), written to etcd."""
    argv = pinned([sys.executable, CLIENT, "register", "--url", lab.etcd_url, "--prefix", prefix,
                   "--count", str(count)])  # fmt: skip
    writer = await lab.start(lab.pods[0], argv, private_mount=False)
    try:
        wrote: JSON = json.loads(await wait_line(writer, "{", timeout))
    finally:
        await writer.stop()
    return wrote


def forwarded_to(args: argparse.Namespace) -> int:
    """The records the relay forwards while the watchers hold (each takes every update)."""
    return int(args.watchers * args.updates)


async def seed(lab: Lab, config: Path, count: int, timeout: float) -> JSON:  # noqa: ASYNC109
    """Ranks 0..count-1 registered under one lease (``register.py seed``: valid records,
    100 puts a transaction; 10,000 single puts took 43 s here and one run's failed)."""
    argv = pinned([sys.executable, str(BENCH / "register.py"), "seed", "--etcd", lab.etcd_url,
                   "--spec", str(config), "--ranks", f"0-{count - 1}"])  # fmt: skip
    t0 = time.monotonic()
    result = await lab.run(lab.pods[0], argv, timeout)
    if result.returncode != 0:
        raise RuntimeError(f"register.py seed: {result.stderr.decode(errors='replace')[-600:]}")
    return {"seed_s": round(time.monotonic() - t0, 3)}


async def one_run(lab: Lab, args: argparse.Namespace, index: int) -> JSON:
    empty_cpus, base = [], {}
    for start in range(EMPTY_STARTS):
        empty, cpu, _, _ = await started(lab, f"relay-empty-{index}-{start}", args.size)
        empty_cpus.append(cpu)
        base = memory(empty)
        await empty.process.stop()
    empty_cpu = statistics.median(empty_cpus)

    name = f"relay-{index}"
    config, _ = arm_spec(lab, name, args.size)
    seeded = await seed(lab, config, args.size, args.timeout)
    cache, list_cpu, prefix, _ = await started(lab, name, args.size)
    client: LabProcess | None = None
    try:
        holding = memory(cache)
        rest_members = await rest_share(cache, args.rest)

        go = lab.workdir / f"go-relay-{index}"
        argv = pinned([sys.executable, CLIENT, "watch", "--url", cache.url, "--prefix", prefix,
                       "--transport", "json", "--list", "--watchers", str(args.watchers),
                       "--count", str(args.updates), "--go", str(go)])  # fmt: skip
        cpu0, t0 = cache.cpu, time.monotonic()
        client = await lab.start(lab.pods[0], argv, private_mount=False)
        await wait_line(client, "connected", args.timeout)
        lists_cpu, lists_s = cache.cpu - cpu0, time.monotonic() - t0
        signal_go(go, await lab.etcd_revision() + 1)
        await wait_line(client, "ready", READY_TIMEOUT)
        await trio.sleep(1.0)
        watched = memory(cache)
        rest_watchers = await rest_share(cache, args.rest)

        cpu_b, t_b = cache.cpu, time.monotonic()
        wrote = await put(lab, prefix, args.updates, args.timeout)
        got: JSON = json.loads(await wait_line(client, "{", args.timeout))
        cpu_a, t_a = cache.cpu, time.monotonic()
        after = memory(cache)
    finally:
        if client is not None:
            await client.stop()
        await cache.process.stop()
    if got.get("listed") != args.watchers * args.size or got.get("events") != forwarded_to(args):
        raise RuntimeError(f"the watchers listed {got.get('listed')} and took "
                           f"{got.get('events')} records, not {args.watchers} × {args.size} "
                           f"and {args.watchers} × {args.updates}")  # fmt: skip
    window = t_a - t_b
    forward_cpu = cpu_a - cpu_b - rest_watchers * window
    forwarded = forwarded_to(args)
    figures: JSON = {
        "run": index + 1,
        "empty_start_cpu_s": round(empty_cpu, 3),
        "empty_start_cpus_s": [round(c, 3) for c in empty_cpus],
        "empty_rss_mib": base["rss_mib"],
        "empty_pss_mib": base["pss_mib"],
        "start_cpu_s": round(list_cpu, 3),
        "list_cpu_s": round(list_cpu - empty_cpu, 3),
        "members_rss_mib": holding["rss_mib"],
        "members_pss_mib": holding["pss_mib"],
        "members_kib_per_member": round(
            (holding["rss_mib"] - base["rss_mib"]) * 1024 / args.size, 3
        ),  # fmt: skip
        "rest_share_members": round(rest_members, 5),
        "lists_cpu_s": round(lists_cpu, 3),
        "lists_s": round(lists_s, 3),
        "listed": got.get("listed", 0),
        "us_per_record_listed": round(lists_cpu / max(got.get("listed", 0), 1) * 1e6, 2),
        "watchers_rss_mib": watched["rss_mib"],
        "watchers_pss_mib": watched["pss_mib"],
        "rest_share_watchers": round(rest_watchers, 5),
        "forward_window_s": round(window, 3),
        "forward_cpu_s": round(forward_cpu, 3),
        "forwarded": forwarded,
        "watcher_events": got.get("events", 0),
        "us_per_record_forwarded": round(forward_cpu / forwarded * 1e6, 2),
        "after_rss_mib": after["rss_mib"],
        "record_bytes": wrote["record_bytes"],
        "seed_s": seeded["seed_s"],
        "updates_s": round(wrote["last"] - wrote["first"], 3),
    }
    print(f"  relay: empty {base['rss_mib']:.1f} MiB; {args.size} members "
          f"{holding['rss_mib']:.1f} MiB, listed in {figures['list_cpu_s']:.2f} CPU-s; "
          f"{args.watchers} watchers {watched['rss_mib']:.1f} MiB; "
          f"{figures['us_per_record_listed']:.1f} µs a record listed, "
          f"{figures['us_per_record_forwarded']:.1f} µs a record forwarded; "
          f"rest {rest_watchers:.2%} of a core", flush=True)  # fmt: skip
    return figures


KEYS = ("empty_start_cpu_s", "empty_rss_mib", "empty_pss_mib", "start_cpu_s", "list_cpu_s",
        "members_rss_mib", "members_pss_mib", "members_kib_per_member", "rest_share_members",
        "lists_cpu_s", "us_per_record_listed", "watchers_rss_mib", "watchers_pss_mib",
        "rest_share_watchers", "forward_cpu_s", "us_per_record_forwarded", "after_rss_mib",
        "forward_window_s", "record_bytes")  # fmt: skip


async def bench(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, {BENCH_CORE})
    runs: list[JSON] = []
    failures: list[JSON] = []
    async with open_lab(2) as lab, trio.open_nursery() as nursery:
        sampler = LoadSampler(own_netns=set(lab.netns_names))
        nursery.start_soon(sampler.run)
        assert lab.etcd is not None
        await trio.run_process(["taskset", "-a", "-p", "-c", str(ETCD_CORE), str(lab.etcd.pid)],
                               capture_stdout=True)  # fmt: skip
        for index in range(runs_for(args.runs)):
            print(f"{NAME}: {args.size} members, {args.watchers} watchers, run {index + 1}",
                  flush=True)  # fmt: skip
            done = await attempt(failures, {"run": index + 1},
                                 lambda i=index: one_run(lab, args, i))  # fmt: skip
            if done is not None:
                runs.append(done)
        nursery.cancel_scope.cancel()
    summary: JSON = {k: spread(r[k] for r in runs) for k in KEYS}
    params = {"size": args.size, "watchers": args.watchers, "updates": args.updates,
              "rest_s": args.rest, "etcd_core": ETCD_CORE, "bench_core": BENCH_CORE,
              "relay_argv": list(RELAY_ARGV), "cores": os.cpu_count()}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summary, sampler.summary(), args.out, failures)
    return len(failures)


def main() -> None:
    check_host(("ip", "unshare", "nsenter", "etcd", "taskset"))
    sys.exit(1 if trio.run(bench, parse_args()) else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
