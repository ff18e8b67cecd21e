#!/usr/bin/env python3
"""Control-plane scale: 256 and 1024 simulated ranks, fake data plane, one real etcd.

Each run builds a lab of ``--procs`` pods plus etcd. Pod i runs one
``bench/sim_ranks.py`` process holding the ranks r with r % procs == i
(interleaved, so every process joins across the whole range), each a whole
``run_daemon`` with its own etcd client, lease, watch, reconciler, state dir
and instance name, and a ``FakeDataplane`` as its device. The processes
start together and start their daemons at a steady pace, ``--rate`` joins
per second in all (a Kubernetes Job's pods appear at a few tens per
second): the join storm. The spec is the production default (lease TTL
10 s, keepalive every 3.3 s, at rest less often above 107 ranks: ``control.renewal``;
resync every 30 s) unless ``--ttl`` says
otherwise. ``bench/etcd_metrics.py`` scrapes etcd's /metrics every second
from pod 0.

Figures per run:

* ``converge_s``: the last registration (the latest ``claimed`` time of any
  daemon, taken when etcd acknowledged its claim) → every daemon's device
  holds all N-1 peers (the latest ``full`` time);
* ``storm_s``: the first process start → that same moment;
* ``cpu_s_per_daemon``: CPU seconds of all sim processes from their start to
  full, divided by N, with the signature checks the process's daemons shared
  (``sim_ranks.SharedProofs``) added back at the rate the process measured
  for the ones it ran (``proofs``: how many of each, µs a check;
  ``cpu_s_per_daemon_measured``: without them, what the cores spent); and at
  rest (``--rest`` s after full) as a share of a core;
* etcd requests per second (gRPC messages received, by method) during the
  storm and at rest, and etcd's own CPU;
* ``etcd_us_per_event``: etcd's CPU from the first start to full (all of it:
  grants, claims, lists and keepalives included) over the watch events it
  delivered meanwhile (``etcd_debugging_mvcc_events_total``). A daemon's watch
  starts at its own list, so it is sent every registration after its own and
  its own: N(N+1)/2 events for a mesh of N (``etcd_events``, next to that figure);
* ``claim_s``: a daemon's start (``run_daemon``) → its claim in etcd (spec
  check, list, watch, its peers on the device, lease, claim), min and median;
* ``projection_s``: time to full mesh at ``TARGET_SIZE`` ranks all started at
  once, with one core per daemon and a 4-core etcd, from this run's costs::

      T = claim_min + cpu_per_daemon × TARGET_SIZE / N
          + TARGET_SIZE (TARGET_SIZE + 1) / 2 × etcd_us_per_event / ETCD_CORES

  A daemon's work to take the mesh is O(N) (it lists, adds and is sent the
  registrations of N-1 peers) and runs serially on its own core; etcd's is
  one delivered event per pair and spreads over its cores. The terms are
  added as if they ran one after the other: an upper bound, since a daemon
  takes events while etcd sends the rest. ``claim_min`` is the least
  start → claim of the run, the one least delayed by the packed cores.

``--resync S`` sets every daemon's ``--resync-interval`` (the reconciler's
safety-net full pass: it reads the device and diffs every peer, and asks etcd
nothing) to S seconds instead of the daemon's default 30; a mesh of more than
8 × S members spaces it to N / 8 s (``vnetd.daemon.reconciler.FULL_PASS_PEERS``).
It is a measuring knob: at 1023 peers, before that spacing,
``join_storm.py --resync 300`` put a daemon's rest at 0.9 ms of CPU a second
against 1.2 at 30 (one run each, 2026-12-04), so the passes were about a
quarter of what a daemon spends at rest.

``--paced SIZE:RATE`` adds one run of SIZE ranks at RATE joins per second,
summarised apart (``paced``): a storm whose work is more than the lab's cores
give (1024 ranks at 25 a second on 2 cores) keeps the daemons' loops behind,
their calls time out and leases expire, and it may not converge within the
window at all; at a rate the cores keep up with, the same mesh shows what a
storm hides: its rest, and how soon it is full after the last registration
when nothing waits for CPU.

Run alone: ``.venv/bin/python bench/control_plane.py --sizes 256 --runs 1``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    base_parser,
    check_host,
    events,
    lab_netns,
    merge_load,
    per_size,
    run_each_size,
    runs_for,
    seeded,
    spread,
    wait_for,
    write_result,
)

from vnetd.config import DEFAULT_RESYNC_INTERVAL
from vnetd.control.renewal import renewal_interval
from vnetd.daemon.reconciler import FULL_PASS_PEERS
from vnetd.lab.cluster import write_spec
from vnetd.lab.open_lab import LabProcess, open_lab
from vnetd.pacing import spaced

NAME = "control_plane"
TITLE = "Control-plane scale (simulated ranks)"
TARGET_SIZE = 1024
ETCD_CORES = 4
"""The cluster ``projection_s`` is for: one core per daemon, an etcd of this many cores."""
CONVERGE_TARGET = 60.0
"""Issue 16's target: 1024 simulated ranks full this long after the last registration."""
CONVERGE_AFTER = 60.0
"""Default for ``--window``: how long after the last scheduled start the mesh may
take before the run is recorded as not converged."""


def warnings(processes: list[LabProcess]) -> dict[str, int]:
    """The daemons' WARNING/ERROR lines, counted by their first words (numbers elided)."""
    counts: dict[str, int] = {}
    for process in processes:
        for line in process.log_text().splitlines():
            if line.startswith("{") or (" WARNING " not in line and " ERROR " not in line):
                continue
            words = line.split(maxsplit=4)[-1].split()[:6]
            key = " ".join("N" if any(c.isdigit() for c in w) else w for w in words)
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:12])


def progress(processes: list[LabProcess]) -> tuple[int, int]:
    """(claimed, full) summed over the latest progress line of each process."""
    claimed = full = 0
    for process in processes:
        latest = [e for e in events(process) if e.get("event") == "progress"]
        if latest:
            claimed += int(latest[-1]["claimed"])
            full += int(latest[-1]["full"])
    return claimed, full


def rates(samples: list[JSON], start: float, end: float) -> JSON:
    """Per-second rates of etcd's counters between the samples nearest ``start`` and ``end``."""
    good = [s for s in samples if "error" not in s]
    if len(good) < 2:
        return {}
    first = min(good, key=lambda s: abs(s["t"] - start))
    last = min(good, key=lambda s: abs(s["t"] - end))
    span = last["t"] - first["t"]
    if span <= 0:
        return {}

    def delta(part: str) -> dict[str, float]:
        keys = set(first[part]) | set(last[part])
        return {k: round((last[part].get(k, 0) - first[part].get(k, 0)) / span, 2) for k in keys}

    received = delta("received")
    return {
        "window_s": round(span, 2),
        "requests_per_s": round(sum(received.values()), 1),
        "received_per_s": received,
        "sent_per_s": delta("sent"),
        "mvcc_per_s": delta("mvcc"),
        "lease_per_s": delta("lease"),
        "etcd_cpu_share": round((last["cpu"] - first["cpu"]) / span, 3),
    }


def event_cost(samples: list[JSON], start: float, end: float) -> JSON:
    """Watch events etcd delivered between the scrapes nearest ``start`` and ``end``,
    its CPU meanwhile, and the CPU per event (µs)."""
    good = [s for s in samples if "error" not in s]
    if len(good) < 2:
        return {}
    first = min(good, key=lambda s: abs(s["t"] - start))
    last = min(good, key=lambda s: abs(s["t"] - end))
    delivered = last["mvcc"].get("events", 0) - first["mvcc"].get("events", 0)
    cpu = last["cpu"] - first["cpu"]
    return {
        "events": int(delivered),
        "cpu_s": round(cpu, 3),
        "us_per_event": round(cpu / delivered * 1e6, 1) if delivered > 0 else None,
    }


def projection(
    size: int, cpu_per_daemon: float, us_per_event: float | None, claim_min: float | None
) -> JSON | None:
    """Time to full mesh at ``TARGET_SIZE`` ranks on a cluster (module docstring)."""
    if us_per_event is None or claim_min is None:
        return None
    daemon = cpu_per_daemon * TARGET_SIZE / size
    etcd = TARGET_SIZE * (TARGET_SIZE + 1) / 2 * us_per_event / 1e6 / ETCD_CORES
    return {"claim_s": round(claim_min, 3), "daemon_s": round(daemon, 3),
            "etcd_s": round(etcd, 3), "total_s": round(claim_min + daemon + etcd, 3)}  # fmt: skip


def series(samples: list[JSON], t0: float) -> list[list[float]]:
    """``[[s since t0, requests/s], ...]`` between consecutive scrapes (for the plot)."""
    good = [s for s in samples if "error" not in s]
    out = []
    for a, b in zip(good, good[1:], strict=False):
        span = b["t"] - a["t"]
        if span > 0:
            n = sum(b["received"].values()) - sum(a["received"].values())
            out.append([round(b["t"] - t0, 2), round(n / span, 1)])
    return out


async def one_run(
    size: int,
    procs: int,
    rest: float,
    rate: float,
    ttl: int,
    window: float,
    own_proofs: bool,
    resync: float,
) -> JSON:
    timeout = size / rate + window
    async with open_lab(procs) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            spec = write_spec(lab.workdir / "mesh.toml", size, lab.etcd_url, ttl=ttl)
            scraper = await lab.start(
                lab.pods[0],
                [sys.executable, str(BENCH / "etcd_metrics.py"), "--url", lab.etcd_url,
                 "--interval", "1", "--duration", str(timeout + rest + 60)],
                private_mount=False,
            )  # fmt: skip
            await trio.sleep(2.5)
            t0 = time.time()
            sims = []
            for i, pod in enumerate(lab.pods):
                ranks = ",".join(str(r) for r in range(i, size, procs))
                argv = [sys.executable, str(BENCH / "sim_ranks.py"), "--config", str(spec),
                        "--ranks", ranks, "--state-root", str(pod.state_dir),
                        "--stagger", str(procs / rate), "--resync", str(resync),
                        *(["--own-proofs"] if own_proofs else [])]  # fmt: skip
                sims.append(await lab.start(pod, argv, private_mount=False))
            converged = True
            try:
                await wait_for(
                    lambda: (
                        progress(sims)[1] >= size or any(p.returncode is not None for p in sims)
                    ),
                    f"{size} simulated daemons holding every peer",
                    timeout,
                    1.0,
                )
            except TimeoutError:
                converged = False  # recorded as such, with what the daemons logged
            if any(p.returncode is not None for p in sims):
                tail = next(p for p in sims if p.returncode is not None).log_text()[-2000:]
                raise RuntimeError(f"a sim_ranks process exited:\n{tail}")
            all_events = [e for p in sims for e in events(p)]
            claims = [e["t"] for e in all_events if e.get("event") == "claimed"] or [time.time()]
            fulls = [e["t"] for e in all_events if e.get("event") == "full"] or [time.time()]
            cpu_full = sum(_last_cpu(p) for p in sims)
            proofs = shared_proofs(sims)
            full_at = max(fulls) if converged else time.time()
            await trio.sleep(rest if converged else 0)
            rest_end = time.time()
            cpu_rest = sum(_last_cpu(p) for p in sims) - cpu_full
            await trio.sleep(1.5)
            metrics = events(scraper)
            warned = warnings(sims)
            nursery.cancel_scope.cancel()
    last_claim = max(claims)
    waits = [e["t"] - e["started"] for e in all_events
             if e.get("event") == "claimed" and "started" in e]  # fmt: skip
    cost = event_cost(metrics, t0, full_at)
    cpu_per_daemon = (cpu_full + proofs["shared_cpu_s"]) / size
    result = {
        "size": size,
        "rate_per_s": rate,
        "procs": procs,
        "ranks_per_proc": size // procs,
        "converged": converged,
        "claimed": len(claims),
        "full": len(fulls),
        "converge_s": full_at - last_claim if converged else None,
        "storm_s": full_at - t0,
        "registration_span_s": last_claim - min(claims),
        "first_claim_s": min(claims) - t0,
        "cpu_s_per_daemon_to_full": cpu_per_daemon,
        "cpu_s_per_daemon_measured": cpu_full / size,
        "proofs": proofs,
        "etcd_events": cost.get("events"),
        "etcd_events_expected": size * (size + 1) // 2,
        "etcd_us_per_event": cost.get("us_per_event"),
        "claim_s": spread(waits),
        "projection_s": projection(
            size, cpu_per_daemon, cost.get("us_per_event"), min(waits, default=None)
        )
        if converged
        else None,
        "cpu_share_per_daemon_rest": cpu_rest / size / rest if converged else None,
        "etcd_storm": rates(metrics, t0, full_at),
        "etcd_rest": rates(metrics, full_at + 1, rest_end),
        "etcd_series": series(metrics, t0),
        "full_curve": [round(t - t0, 3) for t in sorted(fulls)],
        "claim_curve": [round(t - t0, 3) for t in sorted(claims)],
        "warnings": warned,
        "load": sampler.summary(),
    }
    outcome = (
        f"full mesh {full_at - last_claim:.1f} s after the last registration"
        if converged
        else f"NOT full after {timeout:.0f} s ({len(claims)} claimed, {len(fulls)} full)"
    )
    print(
        f"  {size} ranks in {procs} processes: {outcome} ({result['storm_s']:.1f} s after "
        "start); CPU "
        f"{result['cpu_s_per_daemon_to_full']:.3f} s/daemon; etcd "
        f"{result['etcd_us_per_event'] or 0:.0f} µs/event ({result['etcd_events']} events), "
        f"{result['etcd_storm'].get('requests_per_s', 0):.0f} req/s storm, "
        f"{result['etcd_rest'].get('requests_per_s', 0):.0f} req/s rest",
        flush=True,
    )
    return result


def _last_cpu(process: LabProcess) -> float:
    return float(_last_progress(process).get("cpu", 0.0))


def _last_progress(process: LabProcess) -> JSON:
    latest = [e for e in events(process) if e.get("event") == "progress"]
    return latest[-1] if latest else {}


def shared_proofs(sims: list[LabProcess]) -> JSON:
    """The signature checks the sims' daemons shared and ran up to now, and what
    the shared ones would have cost each daemon checking its own (s, all sims)."""
    latest = [_last_progress(p) for p in sims]
    shared = sum(int(e.get("proofs_shared", 0)) for e in latest)
    verified = sum(int(e.get("proofs_verified", 0)) for e in latest)
    cpu = sum(float(e.get("proofs_cpu", 0.0)) for e in latest)
    per = cpu / verified if verified else 0.0
    return {"shared": shared, "verified": verified, "us_per_check": round(per * 1e6, 1),
            "shared_cpu_s": round(shared * per, 3)}  # fmt: skip


def size_rates(text: str) -> dict[int, float]:
    """``--paced``: ``SIZE:RATE,...`` (a rate may be fractional: ``1024:1.5``)."""
    try:
        pairs = (item.split(":") for item in text.split(",") if item.strip())
        rates = {int(size): float(rate) for size, rate in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not SIZE:RATE,...") from None
    if any(rate <= 0 for rate in rates.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: a rate is joins per second, above 0")
    return rates


def summarize(runs: list[JSON], sizes: list[int]) -> JSON:
    by_size: JSON = {}
    for size in sizes:
        mine = [r for r in runs if r["size"] == size]
        by_size[str(size)] = {
            "runs": len(mine),
            "procs": mine[0]["procs"] if mine else None,
            "converge_s": spread(r["converge_s"] for r in mine),
            "converged": sum(1 for r in mine if r["converged"]),
            "storm_s": spread(r["storm_s"] for r in mine),
            "registration_span_s": spread(r["registration_span_s"] for r in mine),
            "cpu_s_per_daemon_to_full": spread(r["cpu_s_per_daemon_to_full"] for r in mine),
            "cpu_share_per_daemon_rest": spread(r["cpu_share_per_daemon_rest"] for r in mine),
            "etcd_storm_rps": spread(r["etcd_storm"].get("requests_per_s") for r in mine),
            "etcd_rest_rps": spread(r["etcd_rest"].get("requests_per_s") for r in mine),
            "etcd_storm_cpu": spread(r["etcd_storm"].get("etcd_cpu_share") for r in mine),
            "etcd_rest_cpu": spread(r["etcd_rest"].get("etcd_cpu_share") for r in mine),
            "etcd_us_per_event": spread(r.get("etcd_us_per_event") for r in mine),
            "claim_s_min": spread((r.get("claim_s") or {}).get("min") for r in mine),
            "projection_s": spread((r.get("projection_s") or {}).get("total_s") for r in mine),
        }
    return {"by_size": by_size, "target_s": CONVERGE_TARGET, "target_size": TARGET_SIZE,
            "target_cpu_s_per_daemon": 0.1, "target_etcd_us_per_event": 30.0}  # fmt: skip


async def main_async(args: Any) -> int:  # noqa: ANN401
    seed, _rng = seeded(args.seed)

    def run(rate: float) -> Callable[[int, int], Awaitable[JSON]]:
        return lambda size, _i: one_run(size, args.procs, runs_for(args.rest, size), rate,
                                        args.ttl, args.window, args.own_proofs,
                                        args.resync)  # fmt: skip

    runs, failures = await run_each_size("control plane", args.sizes, args.runs, run(args.rate))
    paced: list[JSON] = []
    for size, rate in args.paced.items():
        done, failed = await run_each_size(f"control plane at {rate}/s", [size], {0: 1}, run(rate))
        paced += done
        failures += failed
    every_size = [*args.sizes, *args.paced]
    params = {"sizes": args.sizes, "runs": {size: runs_for(args.runs, size) for size in args.sizes},
              "procs": args.procs,
              "rest_s": {size: runs_for(args.rest, size) for size in args.sizes},
              "rate_per_s": args.rate, "lease_ttl_s": args.ttl, "resync_s": args.resync,
              "keepalive_s": {size: renewal_interval(args.ttl, size) for size in every_size},
              "resync_every_s": {size: spaced(args.resync, size, FULL_PASS_PEERS)
                                 for size in every_size},
              "window_s": args.window, "shared_proofs": not args.own_proofs,
              "paced": {size: rate for size, rate in args.paced.items()},
              "seed": seed}  # fmt: skip
    summary = summarize(runs, args.sizes)
    summary["paced"] = summarize(paced, list(args.paced))["by_size"]
    write_result(NAME, TITLE, params, runs + [{**r, "paced": True} for r in paced], summary,
                 merge_load([r["load"] for r in runs + paced]), args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(256, 1024), runs=2)
    parser.add_argument("--procs", type=int, default=4, help="sim processes (pods), default 4")
    parser.add_argument("--rest", type=per_size, default={0: 20},
                        help="seconds at rest after full: N, or SIZE:N,... (default 20); the "
                        "spaced requests of a large mesh (vnetd.pacing) come every "
                        "N / 4 s, so a rest shorter than that misses them")  # fmt: skip
    parser.add_argument("--rate", type=float, default=25.0, help="joins per second (default 25)")
    parser.add_argument("--paced", type=size_rates, default={},
                        help="SIZE:RATE,...: one more run of SIZE ranks at RATE joins/s each "
                        "(module docstring)")  # fmt: skip
    parser.add_argument("--ttl", type=int, default=10, help="lease TTL, s (default 10)")
    parser.add_argument("--resync", type=float, default=DEFAULT_RESYNC_INTERVAL,
                        help="each daemon's --resync-interval, s (default "
                        f"{DEFAULT_RESYNC_INTERVAL:g}, the daemon's; module "
                        "docstring)")  # fmt: skip
    parser.add_argument("--window", type=float, default=CONVERGE_AFTER,
                        help="s after the last scheduled start before a run counts as not "
                        f"converged (default {CONVERGE_AFTER:g})")  # fmt: skip
    parser.add_argument("--own-proofs", action="store_true",
                        help="every simulated daemon verifies each record itself "
                        "(sim_ranks.py's docstring says why they share by default)")  # fmt: skip
    args = parser.parse_args()
    check_host(("ip", "unshare", "etcd"))
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
