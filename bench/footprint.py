#!/usr/bin/env python3
"""Footprint: resident memory of one real daemon with 1, 64 and 1023 peers; idle CPU over 60 s.

A lab of two pods: pod 0 runs ``vnetd up`` for rank 0 of a 1024-rank mesh
(the production lease TTL of 10 s and resync of 30 s); from pod 1,
``bench/register.py seed`` registers the other ranks directly in etcd with
valid records: random X25519 public keys, endpoints in the lab's underlay
(198.18.200.0 and up) on which nothing listens.

The measured daemon joins a mesh whose members registered before it, as
the last rank of a job does: for each step (1, then 64, then 1023 peers)
the members are registered first and the daemon is then started anew
(SIGTERM before, which revokes its entry, so each start is a new and the
latest registration). By the one-initiator rule (invariant 10) the members
start every handshake, so the daemon adds them with their endpoints held
and, 2 s after its claim, writes each endpoint once (the responder's
fallback); the fake members never answer and nothing sends to their overlay
addresses, so no handshake and no traffic follows. (Registered *after* the
daemon, they would make it their initiator, retrying handshakes to 1023
silent peers, which no real mesh asks of it.) What is left out is what real
members would add: their handshakes and the keepalives their initiators send
(1023/25 s ≈ 41 packets a second to wireguard-go).

After each step's start the bench waits until the daemon's log shows every
peer, lets it settle, and reads VmRSS (and PSS) of the vnetd process and of
its wireguard-go child separately. At 1023 peers it then reads the CPU both
use over ``--idle`` s with nothing changing (at 1023 peers a daemon renews every
5 s at rest, takes its full pass every 128 s and restarts its watch from its last
revision every 256 s or up to a quarter sooner: the params record each).
The 1023 step's start is also reported as the restart with 1023 peers
registered: the time to all peers and its first pass's duration.

Run alone: ``.venv/bin/python bench/footprint.py --runs 1 --idle 20 --out DIR``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    JsonMesh,
    LoadSampler,
    base_parser,
    check_host,
    lab_netns,
    merge_load,
    peers_held,
    plan_durations_ms,
    proc_cpu_seconds,
    proc_pss_kib,
    proc_rss_kib,
    run_repeated,
    runs_for,
    spread,
    wait_for,
    write_result,
)

from vnetd.config import DEFAULT_RESYNC_INTERVAL
from vnetd.control.renewal import renewal_interval
from vnetd.control.watcher import WATCH_RESTARTS
from vnetd.daemon.reconciler import FULL_PASS_PEERS
from vnetd.lab.cluster import write_spec
from vnetd.lab.netns import child_pid
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.pacing import spaced
from vnetd.spec import load_spec

NAME = "footprint"
TITLE = "Footprint of one daemon"
SIZE = 1024
STEPS = (1, 64, 1023)
SETTLE = 5.0


async def seed(lab: Lab, spec_path: str, first: int, last: int) -> None:
    argv = [sys.executable, str(BENCH / "register.py"), "seed", "--etcd", lab.etcd_url,
            "--spec", spec_path, "--ranks", f"{first}-{last}",
            "--endpoint-base", "198.18.200.0"]  # fmt: skip
    result = await lab.run(lab.pods[1], argv, 120)
    if result.returncode != 0:
        raise RuntimeError(f"register.py seed: {result.stderr.decode(errors='replace')}")


def memory(pid: int) -> JSON:
    wg = child_pid(pid, "wireguard-go")
    return {
        "vnetd_rss_mib": proc_rss_kib(pid) / 1024,
        "vnetd_pss_mib": proc_pss_kib(pid) / 1024,
        "wg_rss_mib": proc_rss_kib(wg) / 1024 if wg else None,
        "wg_pss_mib": proc_pss_kib(wg) / 1024 if wg else None,
    }


async def one_run(idle: float) -> JSON:
    async with open_lab(2) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            path = write_spec(lab.workdir / "mesh.toml", SIZE, lab.etcd_url, ttl=10)
            mesh = JsonMesh(lab, path, load_spec(path))
            steps: list[JSON] = []
            seeded = 0
            for peers in STEPS:
                if 0 in mesh.daemons:
                    await mesh.daemons[0].stop()  # its entry goes: the next start is the latest
                await seed(lab, str(path), seeded + 1, peers)
                seeded = peers
                started = time.monotonic()
                await mesh.start_rank(0)
                await wait_for(lambda n=peers: len(peers_held(mesh.log(0))) >= n,
                               f"{peers} peers on rank 0's device", 120, 0.5)  # fmt: skip
                to_all_peers_s = time.monotonic() - started
                await trio.sleep(SETTLE)
                steps.append({"peers": peers, "to_all_peers_s": to_all_peers_s,
                              "first_pass_ms": max(plan_durations_ms(mesh.log(0)), default=None),
                              **memory(mesh.daemons[0].pid)})  # fmt: skip
            pid = mesh.daemons[0].pid
            wg = child_pid(pid, "wireguard-go") or 0
            cpu0 = (proc_cpu_seconds(pid), proc_cpu_seconds(wg), time.monotonic())
            await trio.sleep(idle)
            cpu1 = (proc_cpu_seconds(pid), proc_cpu_seconds(wg), time.monotonic())
            span = cpu1[2] - cpu0[2]
            idle_cpu = {
                "seconds": span,
                "peers": STEPS[-1],
                "vnetd_share": (cpu1[0] - cpu0[0]) / span,
                "wg_share": (cpu1[1] - cpu0[1]) / span,
            }
            restart = steps[-1]
            nursery.cancel_scope.cancel()
    print(
        "  "
        + "; ".join(
            f"{s['peers']} peers: vnetd {s['vnetd_rss_mib']:.1f} MiB, "
            f"wireguard-go {s['wg_rss_mib']:.1f} MiB"
            for s in steps
        )
        + f"; idle CPU vnetd {idle_cpu['vnetd_share']:.2%} wireguard-go "
        f"{idle_cpu['wg_share']:.2%} of a core",
        flush=True,
    )
    return {"steps": steps, "idle": idle_cpu, "restart": restart, "load": sampler.summary()}


def summarize(runs: list[JSON]) -> JSON:
    steps: JSON = {}
    for peers in STEPS:
        mine = [s for r in runs for s in r["steps"] if s["peers"] == peers]
        steps[str(peers)] = {
            key: spread(s[key] for s in mine)
            for key in ("vnetd_rss_mib", "vnetd_pss_mib", "wg_rss_mib", "wg_pss_mib")
        }
    restarts = [r["restart"] for r in runs]
    return {
        "steps": steps,
        "restart_1023": {
            key: spread(r[key] for r in restarts)
            for key in ("vnetd_rss_mib", "wg_rss_mib", "to_all_peers_s", "first_pass_ms")
        },
        "idle_vnetd_share": spread(r["idle"]["vnetd_share"] for r in runs),
        "idle_wg_share": spread(r["idle"]["wg_share"] for r in runs),
        "target_rss_mib": 55,
        "target_idle_share": 0.005,
    }


async def main_async(args: Any) -> int:  # noqa: ANN401
    n = runs_for(args.runs)
    runs, failures = await run_repeated("footprint", n, lambda _i: one_run(args.idle))
    params = {"runs": n, "idle_s": args.idle, "steps": list(STEPS), "mesh_size": SIZE,
              "lease_ttl_s": 10, "resync_s": DEFAULT_RESYNC_INTERVAL,
              # at 1023 peers, at rest: what the page says the idle CPU covers
              "keepalive_s": renewal_interval(10, SIZE),
              "resync_every_s": spaced(DEFAULT_RESYNC_INTERVAL, SIZE, FULL_PASS_PEERS),
              "watch_restart_s": spaced(60, SIZE, WATCH_RESTARTS)}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs),
                 merge_load([r["load"] for r in runs]), args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(1,), runs=2)
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, s (default 60)")
    args = parser.parse_args()
    check_host()
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
