#!/usr/bin/env python3
"""Footprint: resident memory of one real daemon with 1, 64, 1023 (and N-1) peers; idle CPU.

A lab of two pods: pod 0 runs ``vnetd up`` for rank 0 of a 1024-rank mesh
(the production lease TTL of 10 s and resync of 30 s); from pod 1,
``bench/register.py seed`` registers the other ranks directly in etcd with
valid records: random X25519 public keys, endpoints in the lab's underlay
(198.18.200.0 and up) on which nothing listens. With ``--size N`` above 1024
(``run_all``: 10,000) a last step runs rank 0 of an N-rank mesh of its own in
the same lab (another name, so another members prefix) with N-1 peers seeded
the same way: 198.18.200.0 + 9,999 is still in the underlay's 198.18.0.0/15,
and the lab's overlay /16 holds 10,000 addresses.

The measured daemon joins a mesh whose members registered before it, as
the last rank of a job does: for each step (1, then 64, then 1023 peers, then
N-1) the members are registered first and the daemon is then started anew
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
peer, takes the daemon's CPU by then, checks the device really holds them
(``wg show`` and ``ip route`` in the daemon's namespaces), lets it settle, and
reads VmRSS (and PSS) of the vnetd process and of its wireguard-go child
separately. At 1023 peers, and at N-1, it then reads the CPU both use over
``--idle`` s with nothing changing (at 1023 peers a daemon renews every 5 s at
rest, takes its full pass every 128 s and restarts its watch from its last
revision every 256 s or up to a quarter sooner: the params record each, and the
same for N under ``largest``). The 1023 step's start is also reported as the
restart with 1023 peers registered: the time to all peers and its first pass's
duration; the last step's under ``largest``.

Run alone: ``.venv/bin/python bench/footprint.py --runs 1 --idle 20 --out DIR``
(``--size 10000``: about 3 minutes a run here).
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
IDLE_AT = 1023
"""The step whose idle CPU the page's target reads (and a larger ``--size``'s last step)."""
SETTLE = 5.0


def steps_for(size: int) -> tuple[int, ...]:
    """The peer counts measured in a mesh of ``size``: 1, 64, 1023 and ``size - 1``."""
    return tuple(sorted({p for p in (*STEPS, size - 1) if 1 <= p < size}))


def peers_timeout(peers: int) -> float:
    """A bound on one start reaching ``peers`` (2 minutes, and 30 ms a peer above 1023)."""
    return 120.0 + max(0, peers - 1023) * 0.03


async def seed(lab: Lab, spec_path: str, first: int, last: int) -> None:
    argv = [sys.executable, str(BENCH / "register.py"), "seed", "--etcd", lab.etcd_url,
            "--spec", spec_path, "--ranks", f"{first}-{last}",
            "--endpoint-base", "198.18.200.0"]  # fmt: skip
    result = await lab.run(lab.pods[1], argv, peers_timeout(last - first + 1))
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


async def device_counts(pid: int, interface: str) -> JSON:
    """What the device really holds: its peers (``wg show`` in the daemon's mount and
    network namespaces, where its UAPI socket is) and the routes through it (one /32 a
    peer), not only what the daemon logged."""
    ns = ["nsenter", "-t", str(pid), "-m", "-n"]
    wg = await trio.run_process([*ns, "wg", "show", interface, "peers"], capture_stdout=True)
    routes = await trio.run_process([*ns, "ip", "-4", "route", "show", "dev", interface],
                                    capture_stdout=True)  # fmt: skip
    return {"device_peers": len(wg.stdout.split()),
            "device_routes": len(routes.stdout.splitlines())}  # fmt: skip


async def idle_cpu(pid: int, peers: int, idle: float) -> JSON:
    """The daemon's and its wireguard-go's CPU share over ``idle`` s with nothing changing."""
    wg = child_pid(pid, "wireguard-go") or 0
    cpu0 = (proc_cpu_seconds(pid), proc_cpu_seconds(wg), time.monotonic())
    await trio.sleep(idle)
    cpu1 = (proc_cpu_seconds(pid), proc_cpu_seconds(wg), time.monotonic())
    span = cpu1[2] - cpu0[2]
    return {
        "seconds": span,
        "peers": peers,
        "vnetd_share": (cpu1[0] - cpu0[0]) / span,
        "wg_share": (cpu1[1] - cpu0[1]) / span,
    }


def mesh_size(peers: int, size: int) -> int:
    """The mesh a step runs in: 1024 ranks up to 1023 peers (the page's figures, their
    spacing by mesh size as before), ``size`` above (a mesh of its own in the same lab)."""
    return SIZE if peers < SIZE else size


async def one_run(size: int, idle: float) -> JSON:
    steps_wanted = steps_for(size)
    async with open_lab(2) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            meshes: dict[int, tuple[JsonMesh, int]] = {}  # by size: the mesh, ranks seeded
            running: JsonMesh | None = None
            steps: list[JSON] = []
            idles: list[JSON] = []
            for peers in steps_wanted:
                n = mesh_size(peers, size)
                if n not in meshes:
                    path = write_spec(lab.workdir / f"mesh-{n}.toml", n, lab.etcd_url, ttl=10,
                                      name=f"lab{n}")  # fmt: skip
                    meshes[n] = (JsonMesh(lab, path, load_spec(path)), 0)
                mesh, seeded = meshes[n]
                if running is not None:
                    await running.daemons[0].stop()  # its entry goes: the next start is the latest
                await seed(lab, str(mesh.spec_path), seeded + 1, peers)
                meshes[n] = (mesh, peers)
                running = mesh
                started = time.monotonic()
                await mesh.start_rank(0)
                await wait_for(lambda m=mesh, k=peers: len(peers_held(m.log(0))) >= k,
                               f"{peers} peers on rank 0's device", peers_timeout(peers),
                               0.5)  # fmt: skip
                to_all_peers_s = time.monotonic() - started
                pid = mesh.daemons[0].pid
                cpu_to_all_peers_s = proc_cpu_seconds(pid)
                await trio.sleep(SETTLE)
                steps.append(
                    {
                        "peers": peers,
                        "mesh_size": n,
                        "to_all_peers_s": to_all_peers_s,
                        "cpu_to_all_peers_s": cpu_to_all_peers_s,
                        "first_pass_ms": max(plan_durations_ms(mesh.log(0)), default=None),
                        **memory(pid),
                        **await device_counts(pid, mesh.spec.interface),
                    }
                )
                if steps[-1]["device_peers"] != peers:
                    raise RuntimeError(f"{peers} peers logged, {steps[-1]['device_peers']} on "
                                       "rank 0's device")  # fmt: skip
                if peers == IDLE_AT or peers == steps_wanted[-1]:
                    idles.append(await idle_cpu(pid, peers, idle))
            nursery.cancel_scope.cancel()
    at = {i["peers"]: i for i in idles}
    print("  " + "; ".join(f"{s['peers']} peers: vnetd {s['vnetd_rss_mib']:.1f} MiB, "
                           f"wireguard-go {s['wg_rss_mib']:.1f} MiB, all in "
                           f"{s['to_all_peers_s']:.1f} s" for s in steps)
          + "; idle CPU " + ", ".join(f"at {p}: vnetd {i['vnetd_share']:.2%} wireguard-go "
                                      f"{i['wg_share']:.2%}" for p, i in at.items())
          + " of a core", flush=True)  # fmt: skip
    return {"steps": steps, "idle": at.get(IDLE_AT, idles[-1]), "idle_largest": idles[-1],
            "restart": next((s for s in steps if s["peers"] == IDLE_AT), steps[-1]),
            "largest": steps[-1], "load": sampler.summary()}  # fmt: skip


MEMORY = ("vnetd_rss_mib", "vnetd_pss_mib", "wg_rss_mib", "wg_pss_mib")
START = ("vnetd_rss_mib", "wg_rss_mib", "to_all_peers_s", "first_pass_ms", "cpu_to_all_peers_s",
         "device_routes")  # fmt: skip


def summarize(runs: list[JSON], size: int) -> JSON:
    steps: JSON = {}
    for peers in steps_for(size):
        mine = [s for r in runs for s in r["steps"] if s["peers"] == peers]
        steps[str(peers)] = {key: spread(s[key] for s in mine) for key in MEMORY}
    restarts = [r["restart"] for r in runs]
    largest = [r["largest"] for r in runs]
    return {
        "steps": steps,
        "restart_1023": {key: spread(r.get(key) for r in restarts) for key in START},
        "idle_vnetd_share": spread(r["idle"]["vnetd_share"] for r in runs),
        "idle_wg_share": spread(r["idle"]["wg_share"] for r in runs),
        # the last step (size - 1 peers): its start and its idle CPU
        "largest": {
            "peers": size - 1,
            **{key: spread(r.get(key) for r in largest) for key in (*MEMORY, *START[2:])},
            "idle_vnetd_share": spread(r["idle_largest"]["vnetd_share"] for r in runs),
            "idle_wg_share": spread(r["idle_largest"]["wg_share"] for r in runs),
        },
        "target_rss_mib": 55,
        "target_idle_share": 0.005,
    }


def at_rest(size: int) -> JSON:
    """What a daemon of a ``size``-rank mesh does at rest (spaced by the mesh's size)."""
    return {"keepalive_s": renewal_interval(10, size),
            "resync_every_s": spaced(DEFAULT_RESYNC_INTERVAL, size, FULL_PASS_PEERS),
            "watch_restart_s": spaced(60, size, WATCH_RESTARTS)}  # fmt: skip


async def main_async(args: Any) -> int:  # noqa: ANN401
    n = runs_for(args.runs)
    size = args.size
    runs, failures = await run_repeated("footprint", n, lambda _i: one_run(size, args.idle))
    params = {"runs": n, "idle_s": args.idle, "steps": list(steps_for(size)), "mesh_size": SIZE,
              "size": size,
              "idle_at": sorted({IDLE_AT, size - 1}),
              "lease_ttl_s": 10, "resync_s": DEFAULT_RESYNC_INTERVAL,
              # at 1023 peers, at rest: what the page says the idle CPU covers
              **at_rest(SIZE),
              # and at the last step, in a mesh of ``size``
              "largest": at_rest(size)}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs, size),
                 merge_load([r["load"] for r in runs]), args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(1,), runs=2)
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, s (default 60)")
    parser.add_argument(
        "--size",
        type=int,
        default=SIZE,
        help=f"mesh size; its last step holds size - 1 peers (default {SIZE})",
    )
    args = parser.parse_args()
    if args.size < SIZE:
        parser.error(f"--size: at least {SIZE} (the steps up to 1023 peers run in {SIZE} ranks)")
    check_host()
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
