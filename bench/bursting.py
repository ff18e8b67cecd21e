#!/usr/bin/env python3
"""Bursting into a second site: reach of rank 0, throughput and failover through gateways.

Each run builds one two-site NAT lab (``vnetd.lab.sites``, as
``tests/e2e/test_sites.py`` does): site a holds ranks 0-2, site b ranks
3-6, each site behind its own masquerading router, etcd on the public side,
lease TTL 5 s. Rank 1 is site a's gateway, ranks 3 and 4 site b's (rank 3
active, 4 standby); the gateway pods forward IP. The run has two phases in
the same pods, one per layout, their order alternating from run to run;
before each the routers forward only the ports that layout exposes and
forget their NAT mappings, and each phase is its own mesh (spec name), so
nothing carries over but the pods' keys:

* **direct**: every pod's WireGuard port is forwarded and every member runs
  with ``--public-endpoint``; no gateways.
* **gateways**: only ranks 1, 3 and 4 are forwarded (and have a public
  endpoint); the spec names the gateways, so 5 → 0 travels 5 → 3 → 1 → 0.

In each phase a UDP prober (``vnetd.lab.probe``, every ``--interval`` s to
every rank) runs in every pod from the start. Site a's ranks start and
mesh; then site b's start (direct: in a random order; gateways: the two
gateways first, then the members; random gaps of 0..``--max-gap`` s). The
figures, all ``time.monotonic()``:

1. **reach**: each site-b rank's ``vnetd up`` start (and its readiness,
   ``claimed rank`` in its JSON log) → its first reply from rank 0 over the
   overlay.
2. **throughput**: once the mesh is full, iperf3 TCP from rank 5 (site b)
   to rank 2 (site a) for ``--seconds`` s (first second omitted); the ratio
   is the gateway phase over the direct phase of the same run.
3. **gateway failover** (gateways phase): every process of gateway 3's pod
   is killed by pid (``Lab.kill_pod``, as a node failure); its entry ends
   after the lease TTL and the other daemons move its routes to gateway 4.
   The pause is the longest run of consecutive lost probe requests of any
   cross-site pair of live ranks (the longest gap in replies), and the kill
   → the last lost request sent.

Writes ``bursting.json``. Run alone: ``.venv/bin/python bench/bursting.py --runs 1``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio
from common import (
    JSON,
    ClockMap,
    JsonMesh,
    LoadSampler,
    base_parser,
    check_host,
    claim_time,
    lab_netns,
    merge_load,
    run_repeated,
    runs_for,
    seeded,
    spread,
    wait_for,
    write_result,
)

from vnetd.lab.cluster import write_spec
from vnetd.lab.probe import probe_command
from vnetd.lab.sites import SitesLab, open_sites_lab
from vnetd.spec import load_spec

NAME = "bursting"
TITLE = "Bursting into a second site"
SITES = {"a": 3, "b": 4}
SITE_A, SITE_B = [0, 1, 2], [3, 4, 5, 6]
GATEWAYS = {"a": [1], "b": [3, 4]}
KILLED = 3
"""Site b's active gateway (its lowest-ranked registered one), killed in phase gateways."""
IPERF_CLIENT, IPERF_SERVER = 5, 2
IPERF_PORT = 5201
TTL = 5
MODES = ("direct", "gateways")


def site_of(rank: int) -> str:
    return "a" if rank in SITE_A else "b"


# --- the lab for one phase --------------------------------------------------------------


async def expose(lab: SitesLab, ranks: Sequence[int]) -> None:
    """Have the routers forward exactly these pods' WireGuard ports (each site must
    keep at least one), and forget their NAT mappings: a phase starts as if fresh."""
    lab.forwards.clear()
    for rank in ranks:
        await lab.forward(lab.pods[rank])
    for site in lab.sites.values():
        code = "from pyroute2 import Conntrack; Conntrack().flush()"
        argv = ["ip", "netns", "exec", site.router_netns, sys.executable, "-c", code]
        with trio.fail_after(10):
            await trio.run_process(argv, capture_stderr=True)


async def phase_mesh(lab: SitesLab, mode: str) -> JsonMesh:
    """The mesh of one phase: its own spec (and name, so its own etcd prefix)."""
    path = write_spec(lab.workdir / f"{mode}.toml", len(lab.pods), lab.etcd_url, name=mode,
                      ttl=TTL)  # fmt: skip
    if mode == "gateways":
        with path.open("a") as spec:
            for site, ranks in GATEWAYS.items():
                spec.write(f"\n[sites.{site}]\ngateways = {ranks}\n")
    await expose(lab, range(len(lab.pods)) if mode == "direct" else [1, 3, 4])
    return JsonMesh(lab, path, load_spec(path))


async def start_rank(mesh: JsonMesh, lab: SitesLab, rank: int) -> None:
    """``vnetd up`` in its site, with its public endpoint when its port is forwarded."""
    pod = mesh.pod(rank)
    flags = ["--site", lab.site(pod).name]
    public = lab.public_endpoint(pod) if pod.index in lab.forwards else None
    if public:
        flags += ["--public-endpoint", public]
    await mesh.start_rank(rank, *flags)


async def start_probes(mesh: JsonMesh, interval: float) -> None:
    targets = [mesh.address(r) for r in range(mesh.spec.size)]
    for rank in range(mesh.spec.size):
        argv = probe_command(mesh.address(rank), targets, duration=600, interval=interval)
        mesh.probes[rank] = await mesh.lab.start(mesh.pod(rank), argv, private_mount=False)
    await wait_for(lambda: all('"started"' in p.log_text() for p in mesh.probes.values()),
                   "every prober started", 30, 0.1)  # fmt: skip


def pairs(among: set[int]) -> set[tuple[int, int]]:
    return {(a, b) for a in among for b in among if a != b}


def reached_all(mesh: JsonMesh, wanted: set[tuple[int, int]]) -> bool:
    return wanted <= set(mesh.first_reached())


# --- 1: reach ---------------------------------------------------------------------------


async def burst(mesh: JsonMesh, lab: SitesLab, mode: str, rng: Any, max_gap: float) -> JSON:  # noqa: ANN401
    """Start site a, then site b; each site-b rank's start → its first reply from rank 0."""
    clock = ClockMap()
    order_a = list(SITE_A)
    rng.shuffle(order_a)
    for rank in order_a:
        await start_rank(mesh, lab, rank)
    await wait_for(lambda: reached_all(mesh, pairs(set(SITE_A))), "site a meshed", 60)
    if mode == "gateways":
        gateways, members = list(GATEWAYS["b"]), [r for r in SITE_B if r not in GATEWAYS["b"]]
        rng.shuffle(gateways)
        rng.shuffle(members)
        order_b = gateways + members
    else:
        order_b = list(SITE_B)
        rng.shuffle(order_b)
    for rank in order_b:
        await start_rank(mesh, lab, rank)
        await trio.sleep(rng.uniform(0, max_gap))
    everyone = set(range(len(lab.pods)))
    await wait_for(lambda: reached_all(mesh, {(r, 0) for r in SITE_B}), "site b reaching rank 0",
                   60)  # fmt: skip
    await wait_for(lambda: reached_all(mesh, pairs(everyone)), "full mesh across sites", 60)
    reached = mesh.first_reached()
    loadavg = os.getloadavg()[0]
    ranks = []
    for rank in order_b:
        claimed = claim_time(mesh.log(rank), rank)
        ready = clock.to_monotonic(claimed) if claimed is not None else None
        ranks.append({
            "rank": rank,
            "gateway": rank in GATEWAYS["b"] and mode == "gateways",
            "from_start": reached[(rank, 0)] - mesh.started_at[rank],
            "from_ready": reached[(rank, 0)] - ready if ready is not None else None,
        })  # fmt: skip
    return {"order_a": order_a, "order_b": order_b, "ranks": ranks, "loadavg_1m": loadavg}


# --- 2: throughput ----------------------------------------------------------------------


async def iperf(mesh: JsonMesh, lab: SitesLab, seconds: float) -> JSON:
    """iperf3 TCP rank 5 → rank 2 over the overlay, Gbit/s at the receiver."""
    server = await lab.start(mesh.pod(IPERF_SERVER), ["iperf3", "-s", "-p", str(IPERF_PORT)],
                             private_mount=False)  # fmt: skip
    try:
        await trio.sleep(0.5)
        argv = ["iperf3", "-c", mesh.address(IPERF_SERVER), "-p", str(IPERF_PORT),
                "-t", str(seconds), "-O", "1", "-J"]  # fmt: skip
        result = await lab.run(mesh.pod(IPERF_CLIENT), argv, seconds + 30)
        if result.returncode != 0:
            raise RuntimeError(f"iperf3: {result.stdout.decode()[-300:]}{result.stderr.decode()}")
        data = json.loads(result.stdout)
        gbps = float(data["end"]["sum_received"]["bits_per_second"]) / 1e9
        retransmits = int(data["end"].get("sum_sent", {}).get("retransmits", 0))
    finally:
        await server.stop()
    return {"gbps": gbps, "retransmits": retransmits, "loadavg_1m": os.getloadavg()[0]}


# --- 3: a gateway dies ------------------------------------------------------------------


def longest_gaps(
    mesh: JsonMesh, across: set[tuple[int, int]], since: float, interval: float
) -> JSON:
    """Per pair, the longest run of consecutive lost requests sent at or after ``since``
    (its duration: first to last lost send, plus one interval), and the last lost send."""
    misses: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for pair, event in mesh._probe_events("miss", None):
        if pair in across and float(event["sent"]) >= since:
            misses.setdefault(pair, []).append((int(event["seq"]), float(event["sent"])))
    longest = 0.0
    last_sent = since
    for lost in misses.values():
        lost.sort()
        start = prev = lost[0]
        for seq, sent in lost[1:]:
            if seq != prev[0] + 1:
                longest = max(longest, prev[1] - start[1] + interval)
                start = (seq, sent)
            prev = (seq, sent)
        longest = max(longest, prev[1] - start[1] + interval)
        last_sent = max(last_sent, prev[1])
    return {"longest_gap_s": longest, "resumed_after_s": last_sent - since,
            "pairs_with_loss": len(misses), "pairs": len(across)}  # fmt: skip


def recovered(mesh: JsonMesh, across: set[tuple[int, int]], since: float) -> bool:
    """Every pair that went ``lost`` after ``since`` answers again (its last event is
    ``recovered``); or, 3 s on, no pair went lost at all."""
    last: dict[tuple[int, int], tuple[float, str]] = {}
    for kind in ("lost", "recovered"):
        for pair, event in mesh._probe_events(kind, None):
            t = float(event["t"])
            if pair in across and t >= since and t >= last.get(pair, (0.0, ""))[0]:
                last[pair] = (t, kind)
    if not last:
        return time.monotonic() - since > 3.0
    return all(kind == "recovered" for _t, kind in last.values())


async def kill_gateway(mesh: JsonMesh, lab: SitesLab, interval: float) -> JSON:
    live = set(range(len(lab.pods))) - {KILLED}
    across = {(a, b) for a, b in pairs(live) if site_of(a) != site_of(b)}
    killed_at = time.monotonic()
    await lab.kill_pod(mesh.pod(KILLED))
    await wait_for(lambda: recovered(mesh, across, killed_at), "cross-site traffic resumed",
                   4 * TTL + 10, 0.1)  # fmt: skip
    await trio.sleep(1.5)  # a request is counted lost 1 s after it was sent (--miss-after)
    return {**longest_gaps(mesh, across, killed_at, interval), "loadavg_1m": os.getloadavg()[0]}


# --- runs -------------------------------------------------------------------------------


async def one_phase(lab: SitesLab, mode: str, rng: Any, args: Any) -> JSON:  # noqa: ANN401
    mesh = await phase_mesh(lab, mode)
    sampler = LoadSampler(own_netns=lab_netns(lab))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            await start_probes(mesh, args.interval)
            result: JSON = {"reach": await burst(mesh, lab, mode, rng, args.max_gap)}
            result["iperf"] = await iperf(mesh, lab, args.seconds)
            if mode == "gateways":
                result["failover"] = await kill_gateway(mesh, lab, args.interval)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for process in [*mesh.probes.values(), *mesh.daemons.values()]:
                await process.stop()
    return {**result, "load": sampler.summary()}


async def one_run(i: int, rng: Any, args: Any) -> JSON:  # noqa: ANN401
    modes = MODES if i % 2 == 0 else MODES[::-1]
    async with open_sites_lab(SITES) as lab:
        for rank in (r for ranks in GATEWAYS.values() for r in ranks):
            await lab.set_sysctl(lab.pods[rank].netns, "net.ipv4.ip_forward", "1")
            await lab.set_sysctl(lab.pods[rank].netns, "net.ipv4.conf.all.send_redirects", "0")
        phases = {mode: await one_phase(lab, mode, rng, args) for mode in modes}
    direct, gw = phases["direct"], phases["gateways"]
    ratio = gw["iperf"]["gbps"] / direct["iperf"]["gbps"] if direct["iperf"]["gbps"] else None
    reach = {m: max(r["from_start"] for r in p["reach"]["ranks"]) for m, p in phases.items()}
    print(
        f"  order {'/'.join(modes)}: slowest site-b rank reached rank 0 {reach['direct']:.2f} s "
        f"(direct), {reach['gateways']:.2f} s (gateways) after its start; iperf3 "
        f"{direct['iperf']['gbps']:.3f} direct, {gw['iperf']['gbps']:.3f} Gbit/s through the "
        f"gateways (ratio {ratio or 0:.2f}); gateway {KILLED} killed: longest gap "
        f"{gw['failover']['longest_gap_s']:.2f} s; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return {"order": list(modes), **phases, "ratio": ratio,
            "load": merge_load([p["load"] for p in phases.values()])}  # fmt: skip


def summarize(runs: list[JSON]) -> JSON:
    def reach(mode: str, gateway: bool | None, key: str = "from_start") -> JSON:
        return spread(
            r[key] for run in runs for r in run[mode]["reach"]["ranks"]
            if gateway is None or r["gateway"] == gateway
        )  # fmt: skip

    def loads(*path: str) -> JSON:
        values = []
        for run in runs:
            node: Any = run
            for key in path:
                node = node.get(key, {}) if isinstance(node, dict) else {}
            if isinstance(node, int | float):
                values.append(float(node))
        return spread(values)

    return {
        "reach_direct_s": reach("direct", None),
        "reach_gateways_members_s": reach("gateways", False),
        "reach_gateways_gateways_s": reach("gateways", True),
        "reach_direct_from_ready_s": reach("direct", None, "from_ready"),
        "reach_gateways_members_from_ready_s": reach("gateways", False, "from_ready"),
        "direct_gbps": spread(run["direct"]["iperf"]["gbps"] for run in runs),
        "gateways_gbps": spread(run["gateways"]["iperf"]["gbps"] for run in runs),
        "ratio": spread(run["ratio"] for run in runs if run["ratio"] is not None),
        "failover_gap_s": spread(run["gateways"]["failover"]["longest_gap_s"] for run in runs),
        "failover_resumed_s": spread(
            run["gateways"]["failover"]["resumed_after_s"] for run in runs
        ),
        "loadavg_1m": {
            "reach_direct": loads("direct", "reach", "loadavg_1m"),
            "reach_gateways": loads("gateways", "reach", "loadavg_1m"),
            "iperf_direct": loads("direct", "iperf", "loadavg_1m"),
            "iperf_gateways": loads("gateways", "iperf", "loadavg_1m"),
            "failover": loads("gateways", "failover", "loadavg_1m"),
        },
    }


async def main_async(args: Any) -> int:  # noqa: ANN401
    seed, rng = seeded(args.seed)
    n = runs_for(args.runs)
    runs, failures = await run_repeated(NAME, n, lambda i: one_run(i, rng, args))
    params = {"runs": n, "seed": seed, "sites": SITES, "gateways": GATEWAYS, "killed": KILLED,
              "iperf": [IPERF_CLIENT, IPERF_SERVER], "seconds": args.seconds,
              "max_gap_s": args.max_gap, "probe_interval_s": args.interval,
              "lease_ttl_s": TTL}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs),
                 merge_load([r["load"] for r in runs]), args.out, failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(7,), runs=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per iperf3 test (5)")
    parser.add_argument("--max-gap", type=float, default=0.5, help="start gaps 0..S (0.5)")
    parser.add_argument("--interval", type=float, default=0.05, help="probe interval (0.05 s)")
    args = parser.parse_args()
    check_host(("ip", "unshare", "nsenter", "etcd", "wireguard-go", "nft", "iperf3"))
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
