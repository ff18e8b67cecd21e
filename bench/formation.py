#!/usr/bin/env python3
"""Mesh formation: propagation latency and time to full mesh, in the same lab runs.

For each cluster size N, each run builds a netns lab (one real etcd; per pod
one ``vnetd up``, its wireguard-go, and ``bench/first_contact.py``), and:

1. **starts the N ranks** in a random order with random gaps (uniform
   0..``--max-gap`` s). The probers start first; each sends to every other
   rank's fixed overlay address every ``--interval`` s until that rank first
   answers (a rank it has no route to yet, i.e. not yet its peer, every
   0.2 s). A pair (a, b) is *reached* when a got its first reply from b, so
   a packet went each way over the overlay. **Time to full mesh** (all
   ``time.monotonic()``): from the last daemon's start, and from the last
   daemon's readiness (``claimed rank`` in its log: address up and rank
   claimed, what ``/readyz`` reports), to the moment every ordered pair was
   reached. Also, for each rank started after rank 0 was ready, its start
   (and its readiness) → its first reply from rank 0.
2. **start-up propagation**: for each rank r, every daemon that had claimed
   its own rank before r claimed gives a sample, ``t(d logs "peer joined:
   rank r") - t(r logs "claimed rank r")``. r logs "claimed" right after
   etcd's answer, but in a process that competes for the 2 CPUs with every
   daemon still starting (a start costs ~0.7 CPU-s of imports), so that line
   can come late: samples slightly short, even negative (counted).
3. **steady propagation**: once the mesh is full and quiet, ``--joins``
   members join one after another, ranks N, N+1, ...: ``bench/register.py
   join`` (at real-time priority, ``chrt -f``, so nothing sits between
   etcd's answer and its timestamp) grants a lease and creates
   ``members/M`` with the claim's own transaction and a valid record (random
   X25519 key, an endpoint nobody answers). Each of the N daemons gives a
   sample, ``t(d logs "peer joined: rank M") - t_ack``. After ``HOLD`` s
   the lease is revoked (a daemon's SIGTERM does the same) and every daemon
   drops the member. The CPU the N
   daemons (and their wireguard-go) spent until the last of them had the
   member, and in the ``HOLD`` s after the join less the same time idling,
   is recorded per daemon.

Log times are the JSON ``time`` field (UTC, microseconds; one clock on the
machine). A daemon logs "peer joined" after ``dataplane.apply`` returned,
i.e. once wireguard-go answered the UAPI ``set`` and the /32 route is in:
the peer is configured. Nothing polls the daemons; the bench reads their
log files and the probers' output.

Writes ``propagation.json`` and ``full_mesh.json``. Run alone:
``.venv/bin/python bench/formation.py --sizes 8 --runs 1``.
"""

from __future__ import annotations

import json
import sys
import time
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
    peer_events,
    peers_held,
    proc_cpu_seconds,
    run_each_size,
    runs_for,
    seeded,
    spread,
    spreads,
    summary_by_size,
    wait_for,
    write_result,
)
from register import random_public_key
from traces import add_trace_option, keep_traces, start_tracing

from vnetd.lab.cluster import write_spec
from vnetd.lab.netns import child_pid
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.spec import load_spec

SETTLE = 2.0
"""Quiet time after the mesh is full, and after a member left, before the next step."""
HOLD = 3.0
"""How long a steady join stays before its lease is revoked (its CPU window)."""
JOIN_WAIT = 30.0
"""Bound on every daemon adding (and then dropping) the joining member."""
JOIN_TTL = 10
"""The joining member's lease (register.py's default): above ``HOLD`` plus a join's
propagation on the host."""
JOINER_ENDPOINT = "198.18.3.250:51820"
"""Inside the lab's underlay, on no pod: nobody answers, and as nothing sends to
the joiner's overlay address, WireGuard sends nothing there either."""
PROBE_DURATION = 900.0


# --- reading the logs -------------------------------------------------------------------


def first_join_after(mesh: JsonMesh, observer: int, rank: int, after: float) -> float | None:
    """When ``observer``'s daemon first logged ``peer joined: rank`` at or after ``after``."""
    for t, kind, peer in peer_events(mesh.log(observer)):
        if kind == "joined" and peer == rank and t >= after:
            return t
    return None


def left_after(mesh: JsonMesh, observer: int, rank: int, after: float) -> bool:
    return any(
        kind == "left" and peer == rank and t >= after
        for t, kind, peer in peer_events(mesh.log(observer))
    )


def pass_ms_after(mesh: JsonMesh, observer: int, t: float) -> float | None:
    """The duration of the reconcile pass whose ``plan applied`` line follows time ``t``
    (the pass that logged a join at ``t``): device read, diff, UAPI set, routes."""
    for line in mesh.log(observer):
        if line.t >= t and line.message.startswith("plan applied: "):
            return float(line.message.split()[5])
    return None


def logs_full(mesh: JsonMesh, size: int) -> bool:
    """Every daemon has claimed and logged all other ranks as peers."""
    everyone = set(range(size))
    for rank in range(size):
        lines = mesh.log(rank)
        if claim_time(lines, rank) is None or peers_held(lines) != everyone - {rank}:
            return False
    return True


_WG_PIDS: dict[int, int | None] = {}
"""Daemon pid → its wireguard-go's pid (one /proc scan each, not one per reading)."""


def cpu_of(mesh: JsonMesh, ranks: list[int]) -> tuple[float, float]:
    """CPU seconds so far of these ranks' daemons, and of their wireguard-go."""
    vnetd = wg = 0.0
    for rank in ranks:
        pid = mesh.daemons[rank].pid
        if _WG_PIDS.get(pid) is None:
            _WG_PIDS[pid] = child_pid(pid, "wireguard-go")
        child = _WG_PIDS[pid]
        vnetd += proc_cpu_seconds(pid)
        wg += proc_cpu_seconds(child) if child else 0.0
    return vnetd, wg


# --- 1 and 2: start-up ------------------------------------------------------------------


async def start_probers(mesh: JsonMesh, size: int, interval: float) -> None:
    targets = ",".join(mesh.address(r) for r in range(size))
    for rank in range(size):
        argv = [sys.executable, str(BENCH / "first_contact.py"), "--self-addr", mesh.address(rank),
                "--targets", targets, "--interval", str(interval),
                "--duration", str(PROBE_DURATION)]  # fmt: skip
        mesh.probes[rank] = await mesh.lab.start(mesh.pod(rank), argv, private_mount=False)
    await wait_for(
        lambda: all('"started"' in p.log_text() for p in mesh.probes.values()),
        "every prober started",
        60,
        0.2,
    )


async def start_up(mesh: JsonMesh, size: int, rng: Any, max_gap: float) -> JSON:  # noqa: ANN401
    """Start every rank in a random order with random gaps; time to full mesh."""
    clock = ClockMap()
    ranks = set(range(size))
    order = list(range(size))
    rng.shuffle(order)
    for rank in order:
        await mesh.start_rank(rank)
        await trio.sleep(rng.uniform(0, max_gap))
    full_at = await mesh.wait_full_mesh(60 + 2 * size, ranks)
    await wait_for(lambda: logs_full(mesh, size), "full mesh in the logs", 60, 0.5)
    claims: dict[int, float] = {}
    for r in range(size):
        claimed = claim_time(mesh.log(r), r)
        assert claimed is not None
        claims[r] = claimed
    ready = {r: clock.to_monotonic(t) for r, t in claims.items()}
    started = dict(mesh.started_at)
    reached = {pair: t for pair, t in mesh.first_reached().items() if set(pair) <= ranks}
    first_start, last_start = min(started.values()), max(started.values())
    rank0 = [
        {"rank": r, "from_start": reached[(r, 0)] - started[r],
         "from_ready": reached[(r, 0)] - ready[r]}
        for r in order
        if r != 0 and started[r] > ready[0] and (r, 0) in reached
    ]  # fmt: skip
    return {
        "order": order,
        "full_mesh": {
            "from_last_start": full_at - last_start,
            "from_last_ready": full_at - max(ready.values()),
            "from_first_start": full_at - first_start,
            "start_span": last_start - first_start,
            "start_to_ready": [ready[r] - started[r] for r in range(size)],
            "rank0_first_packet": rank0,
            "curve": [
                [round(t - first_start, 4), i + 1] for i, t in enumerate(sorted(reached.values()))
            ],
            "starts": sorted(round(t - first_start, 4) for t in started.values()),
            "ready": {r: round(t - first_start, 4) for r, t in ready.items()},
            "pairs": {f"{a}>{b}": round(t - first_start, 4) for (a, b), t in reached.items()},
        },  # fmt: skip
        "startup_propagation": startup_samples(mesh, order, claims),
    }


def startup_samples(mesh: JsonMesh, order: list[int], claims: dict[int, float]) -> JSON:
    samples: list[float] = []
    missing = 0
    for rank in order:
        joined_at = claims[rank]
        for observer in order:
            if observer == rank or claims[observer] >= joined_at:
                continue  # it learnt of `rank` from its first list, not from the watch
            t = first_join_after(mesh, observer, rank, joined_at - 1.0)
            if t is None:
                missing += 1
            else:
                samples.append(t - joined_at)
    return {
        "samples_ms": [round(s * 1000, 3) for s in samples],
        "negative": sum(1 for s in samples if s < 0),
        "missing": missing,
    }


# --- 3: steady joins --------------------------------------------------------------------


async def register(lab: Lab, *args: str) -> JSON:
    """Run ``register.py ARGS`` in pod 0 at real-time priority; its JSON line."""
    argv = ["chrt", "-f", "10", sys.executable, str(BENCH / "register.py"), *args]
    result = await lab.run(lab.pods[0], argv, 30)
    if result.returncode != 0:
        raise RuntimeError(f"register.py {args[0]}: {result.stderr.decode(errors='replace')}")
    data: JSON = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return data


async def idle_cpu(mesh: JsonMesh, size: int, seconds: float) -> tuple[float, float]:
    """CPU seconds all daemons (and their wireguard-go) spend idling for ``seconds``."""
    before = cpu_of(mesh, list(range(size)))
    await trio.sleep(seconds)
    after = cpu_of(mesh, list(range(size)))
    return after[0] - before[0], after[1] - before[1]


async def steady_join(
    mesh: JsonMesh,
    size: int,
    rank: int,
    idle: tuple[float, float],
    join_ttl: int = JOIN_TTL,
    wait: float = JOIN_WAIT,
) -> JSON:
    """Register member ``rank`` (past the ``size`` daemons' ranks) with a new key under
    a lease of ``join_ttl`` s, wait (at most ``wait`` s) for every daemon to add it,
    hold it ``HOLD`` s, revoke its lease and wait for every daemon to drop it. The
    lease must outlive the join's propagation and the hold (the wait is only their
    bound), or it expires first and the revoke finds no lease (a slow guest).

    Each join of a run is a rank of its own (``size + i``): a daemon names a rank's
    peer changes in its log only ``plan_log.FLAP_NAMED`` times a minute (its re-adds
    of a member that never answers count), and the bench reads those lines."""
    ranks = list(range(size))
    lab = mesh.lab
    cpu_before = cpu_of(mesh, ranks)
    joined = await register(lab, "join", "--etcd", lab.etcd_url, "--spec", str(mesh.spec_path),
                            "--rank", str(rank), "--public-key", random_public_key(),
                            "--endpoint", JOINER_ENDPOINT, "--ttl", str(join_ttl))  # fmt: skip
    if not joined["succeeded"]:
        raise RuntimeError(f"members/{rank} was still registered")
    t_send, t_ack = joined["t_send"], joined["t_ack"]
    await wait_for(
        lambda: all(first_join_after(mesh, r, rank, t_send) for r in ranks),
        f"every daemon adding member {rank}",
        wait,
        0.2,
    )
    cpu_joined = cpu_of(mesh, ranks)
    joined_wall = time.time()
    await trio.sleep(max(0.0, t_ack + HOLD - time.time()))
    cpu_after = cpu_of(mesh, ranks)
    joins = {r: first_join_after(mesh, r, rank, t_send) or 0.0 for r in ranks}
    left = await register(lab, "leave", "--etcd", lab.etcd_url, "--lease", str(joined["lease"]))
    await wait_for(
        lambda: all(left_after(mesh, r, rank, left["t_send"]) for r in ranks),
        f"every daemon dropping member {rank}",
        wait,
        0.2,
    )
    passes = [pass_ms_after(mesh, r, joins[r]) for r in ranks]
    await trio.sleep(SETTLE)
    return {
        "ack_rtt_ms": round((t_ack - t_send) * 1000, 3),
        "samples_ms": [round((joins[r] - t_ack) * 1000, 3) for r in ranks],
        "pass_ms": [p for p in passes if p is not None],
        "cpu_ms_per_daemon": {
            part: round((cpu_after[i] - cpu_before[i] - idle[i]) / size * 1000, 2)
            for i, part in enumerate(("vnetd", "wireguard_go"))
        },
        "cpu_ms_per_daemon_until_joined": {
            part: round((cpu_joined[i] - cpu_before[i]) / size * 1000, 2)
            for i, part in enumerate(("vnetd", "wireguard_go"))
        },
        "joined_after_s": round(joined_wall - t_ack, 3),
    }


# --- runs and summaries -----------------------------------------------------------------


async def one_run(size: int, run: int, rng: Any, args: Any) -> JSON:  # noqa: ANN401
    async with open_lab(size, static_neighbours=True) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            path = write_spec(lab.workdir / "mesh.toml", size + args.joins, lab.etcd_url, ttl=5)
            mesh = JsonMesh(lab, path, load_spec(path))
            await start_probers(mesh, size, args.interval)
            startup = await start_up(mesh, size, rng, args.max_gap)
            label = f"formation-{size}-{run + 1}"
            await keep_traces(mesh, args.trace_dir, label, mesh.first_reached(), ClockMap())
            await trio.sleep(SETTLE)
            idle = await idle_cpu(mesh, size, HOLD)
            steady = [await steady_join(mesh, size, size + i, idle) for i in range(args.joins)]
            nursery.cancel_scope.cancel()
    run = {
        "size": size,
        **startup,
        "steady": steady,
        "idle_cpu_ms_per_daemon": [round(x / size * 1000, 2) for x in idle],
        "load": sampler.summary(),
    }
    fm = run["full_mesh"]
    st = latency([s for j in steady for s in j["samples_ms"]])
    su = latency(run["startup_propagation"]["samples_ms"])
    print(
        f"  size {size}: full mesh {fm['from_last_start']:.2f} s after the last start, "
        f"{fm['from_last_ready']:.2f} s after the last readiness (starts over "
        f"{fm['start_span']:.1f} s); propagation steady p50 {st['p50']:.1f} p99 "
        f"{st['p99']:.1f} ms, start-up p50 {su['p50']:.1f} p99 {su['p99']:.1f} ms; "
        f"CPU busy {run['load']['cpu_busy_mean'] or 0:.0%}",
        flush=True,
    )
    return run


def propagation_figures(size: int, mine: list[JSON]) -> JSON:
    """One size's row of the propagation summary, from its runs."""
    steady_runs = [[s for j in r["steady"] for s in j["samples_ms"]] for r in mine]
    startup_runs = [r["startup_propagation"]["samples_ms"] for r in mine]
    joins = [j for r in mine for j in r["steady"]]
    return {
        "steady": latency([s for run in steady_runs for s in run]),
        "startup": latency([s for run in startup_runs for s in run]),
        "steady_p50_runs": spread(latency(x)["p50"] for x in steady_runs),
        "steady_p99_runs": spread(latency(x)["p99"] for x in steady_runs),
        "startup_p50_runs": spread(latency(x)["p50"] for x in startup_runs),
        "startup_p99_runs": spread(latency(x)["p99"] for x in startup_runs),
        "first_observer_ms": spread(min(j["samples_ms"]) for j in joins),
        "pass_ms": latency([p for j in joins for p in j["pass_ms"]]),
        "cpu_ms_per_join_per_daemon": spread(j["cpu_ms_per_daemon"]["vnetd"] for j in joins),
        "cpu_ms_until_joined_per_daemon": spread(
            j["cpu_ms_per_daemon_until_joined"]["vnetd"] for j in joins
        ),
        "wg_cpu_ms_per_join_per_daemon": spread(
            j["cpu_ms_per_daemon"]["wireguard_go"] for j in joins
        ),
        "idle_cpu_ms_per_daemon_per_s": spread(r["idle_cpu_ms_per_daemon"][0] / HOLD for r in mine),
        "ack_rtt_ms": spread(j["ack_rtt_ms"] for j in joins),
        "startup_negative": sum(r["startup_propagation"]["negative"] for r in mine),
        "missing": sum(r["startup_propagation"]["missing"] for r in mine),
    }


def summarize_propagation(runs: list[JSON], sizes: list[int]) -> JSON:
    by_size = summary_by_size(runs, sizes, propagation_figures)
    return {"by_size": by_size, "target_p99_ms": 150, "target_size": 64}


def full_mesh_figures(size: int, runs: list[JSON]) -> JSON:
    """One size's row of the full-mesh summary, from its runs."""
    mine = [r["full_mesh"] for r in runs]
    rank0 = [x for r in mine for x in r["rank0_first_packet"]]
    return {
        **spreads(mine, "from_last_start", "from_last_ready", "from_first_start", "start_span"),
        "start_to_ready": latency([x for r in mine for x in r["start_to_ready"]]),
        "rank0_from_start": latency([x["from_start"] for x in rank0]),
        "rank0_from_ready": latency([x["from_ready"] for x in rank0]),
    }


def summarize_full_mesh(runs: list[JSON], sizes: list[int]) -> JSON:
    by_size = summary_by_size(runs, sizes, full_mesh_figures)
    return {"by_size": by_size, "target_s": 2.0, "target_size": 64}


async def main_async(args: Any) -> int:  # noqa: ANN401
    seed, rng = seeded(args.seed)
    start_tracing(args.trace_dir)
    runs, failures = await run_each_size(
        "formation", args.sizes, args.runs, lambda size, i: one_run(size, i, rng, args)
    )
    params = {"sizes": args.sizes, "runs": {size: runs_for(args.runs, size) for size in args.sizes},
              "seed": seed, "max_gap_s": args.max_gap,
              "probe_interval_s": args.interval, "joins": args.joins, "hold_s": HOLD,
              "lease_ttl_s": 5}  # fmt: skip
    load = merge_load([r["load"] for r in runs])
    propagation = [
        {"size": r["size"], "startup": r["startup_propagation"], "steady": r["steady"],
         "idle_cpu_ms_per_daemon": r["idle_cpu_ms_per_daemon"], "load": r["load"]}
        for r in runs
    ]  # fmt: skip
    full_mesh = [{"size": r["size"], "order": r["order"], **r["full_mesh"], "load": r["load"]}
                 for r in runs]  # fmt: skip
    write_result("propagation", "Propagation latency", params, propagation,
                 summarize_propagation(runs, args.sizes), load, args.out,
                 failures)  # fmt: skip
    write_result("full_mesh", "Time to full mesh", params, full_mesh,
                 summarize_full_mesh(runs, args.sizes), load, args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(8, 32, 64), runs=3)
    parser.add_argument("--max-gap", type=float, default=1.0, help="start gaps 0..S (default 1)")
    parser.add_argument("--interval", type=float, default=0.05, help="probe interval (0.05 s)")
    parser.add_argument("--joins", type=int, default=4, help="steady joins per run (default 4)")
    add_trace_option(parser)
    args = parser.parse_args()
    check_host()
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
