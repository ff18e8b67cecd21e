#!/usr/bin/env python3
"""Data plane: iperf3 over the vnetd overlay vs hand-configured wireguard-go; cost of one change.

A lab of two pods. Each pod runs, at the same time:

* ``vnetd up`` (ranks 0 and 1 of a 1024-rank mesh): wireguard-go on
  ``vnet0``, overlay 10.250.0.0/16, port 51820, MTU 1420;
* a second wireguard-go (the same binary, same environment as vnetd gives
  it) on ``wgb0``, configured by hand with ``wg set`` and ``ip``: overlay
  10.251.0.0/24, port 51830, MTU 1420, one peer.

``iperf3 -c`` in pod 0 against ``iperf3 -s`` in pod 1 then alternates
between the two overlays (``--rounds`` times each, ``--seconds`` s per test,
the first second omitted, the side that goes first alternating), plus the
underlay once per round as the reference. The ratio is vnetd's median over
the hand-made one's.

Then the other 1022 ranks are registered in etcd (valid records, endpoints
nobody answers) and rank 0 is started again after them (the later
registration of every pair, so it starts no handshake with members that
never answer), so rank 0's device holds 1023 peers, and ``--changes``
times one registered endpoint is moved: vnetd's incremental update, timed
by the daemon's own ``plan applied: 1 change(s) in X ms`` (the whole
reconcile pass: diff of the changed rank's peer, UAPI set, routes when they
move). The
hand-made device is filled to 1023 peers too and ``bench/uapi_cost.py``
times, on it, one incremental UAPI ``set`` against a full replace
(``replace_peers=true`` with all 1023 peers, what ``wg setconf`` does), and
whether the live session with pod 1 survives each.

Run alone: ``.venv/bin/python bench/dataplane.py --runs 1 --rounds 2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
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
    run_repeated,
    runs_for,
    spread,
    wait_for,
    write_result,
)

from vnetd.lab.cluster import write_spec
from vnetd.lab.open_lab import Lab, LabProcess, Pod, open_lab
from vnetd.spec import load_spec

NAME = "dataplane"
TITLE = "Data plane"
SIZE = 1024
HAND_IF = "wgb0"
HAND_PORT = 51830
"""Neither the mesh's port (51820) nor its doctor port (51821: each daemon's probe
service binds it on the overlay address, and wireguard-go's wildcard bind then fails
with "Address already in use")."""
IPERF_PORT = 5201


def hand_address(index: int) -> str:
    return f"10.251.0.{index + 1}"


def wg_keypair() -> tuple[str, str]:
    private = subprocess.run(["wg", "genkey"], capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()  # fmt: skip
    public = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, text=True,
                            check=True, timeout=10).stdout.strip()  # fmt: skip
    return private, public


async def run_ok(
    lab: Lab,
    pod: Pod,
    argv: list[str],
    beside: LabProcess | None = None,
    timeout: float = 30,  # noqa: ASYNC109 - passed on to Lab.run
) -> str:
    result = await lab.run(pod, argv, timeout, beside=beside)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {pod.name}: {result.stderr.decode()}")
    return result.stdout.decode()


async def hand_devices(lab: Lab) -> tuple[dict[int, LabProcess], str]:
    """A hand-configured wireguard-go on ``wgb0`` in pods 0 and 1; pod 1's public key."""
    keys = [wg_keypair() for _ in range(2)]
    env = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1", "LOG_LEVEL": "error"}
    devices: dict[int, LabProcess] = {}
    for i in (0, 1):
        pod = lab.pods[i]
        devices[i] = await lab.start(pod, ["wireguard-go", "-f", HAND_IF], env)
        key_file = pod.dir / "hand.key"
        key_file.write_text(keys[i][0] + "\n")
        os.chmod(key_file, 0o600)
    for i in (0, 1):
        pod, other = lab.pods[i], lab.pods[1 - i]
        await wait_for(lambda i=i: _socket_ready(devices[i]), f"{HAND_IF} in {pod.name}", 10)
        await run_ok(lab, pod, ["wg", "set", HAND_IF, "private-key", str(pod.dir / "hand.key"),
                                "listen-port", str(HAND_PORT), "peer", keys[1 - i][1],
                                "endpoint", f"{other.underlay_ip}:{HAND_PORT}",
                                "allowed-ips", f"{hand_address(1 - i)}/32"],
                     beside=devices[i])  # fmt: skip
        await run_ok(lab, pod, ["ip", "addr", "add", f"{hand_address(i)}/24", "dev", HAND_IF],
                     beside=devices[i])  # fmt: skip
        await run_ok(lab, pod, ["ip", "link", "set", HAND_IF, "mtu", "1420", "up"],
                     beside=devices[i])  # fmt: skip
    return devices, keys[1][1]


def _socket_ready(process: LabProcess) -> bool:
    try:
        return Path(f"/proc/{process.pid}/root/run/wireguard/{HAND_IF}.sock").exists()
    except OSError:
        return False


async def iperf(lab: Lab, target: str, seconds: float) -> float:
    """TCP throughput pod 0 → ``target`` in Gbit/s (receiver side)."""
    argv = ["iperf3", "-c", target, "-p", str(IPERF_PORT), "-t", str(seconds), "-O", "1", "-J"]
    out = await run_ok(lab, lab.pods[0], argv, timeout=seconds + 30)
    data = json.loads(out)
    return float(data["end"]["sum_received"]["bits_per_second"]) / 1e9


async def throughput(lab: Lab, mesh: JsonMesh, rounds: int, seconds: float) -> JSON:
    server = await lab.start(lab.pods[1], ["iperf3", "-s", "-p", str(IPERF_PORT)],
                             private_mount=False)  # fmt: skip
    await trio.sleep(0.5)
    targets = {"vnetd": mesh.address(1), "hand": hand_address(1)}
    for target in targets.values():  # a handshake before measuring
        await run_ok(lab, lab.pods[0], ["ping", "-c", "3", "-i", "0.2", "-W", "2", target])
    results: dict[str, list[float]] = {"vnetd": [], "hand": [], "underlay": []}
    for n in range(rounds):
        for side in ("vnetd", "hand") if n % 2 == 0 else ("hand", "vnetd"):
            results[side].append(await iperf(lab, targets[side], seconds))
        results["underlay"].append(await iperf(lab, lab.pods[1].underlay_ip, seconds))
    await server.stop()
    return results


async def seed_members(lab: Lab, mesh: JsonMesh) -> None:
    """Register ranks 2..1023 (valid records, endpoints nobody answers), from pod 1."""
    argv = [sys.executable, str(BENCH / "register.py"), "seed", "--etcd", lab.etcd_url,
            "--spec", str(mesh.spec_path), "--ranks", f"2-{SIZE - 1}",
            "--endpoint-base", "198.18.200.0"]  # fmt: skip
    await run_ok(lab, lab.pods[1], argv, timeout=120)


async def start_full(mesh: JsonMesh, *extra: str, timeout: float = 120) -> None:  # noqa: ASYNC109
    """Start rank 0 (with ``extra`` options) after every other rank registered, and wait
    until its device holds 1023 peers (``timeout`` s) and a quiet 5 s."""
    # Rank 0 starts after the others registered, as a rank joining a formed mesh does:
    # it is the later registration of every pair, so it starts no handshake with
    # members that never answer (invariant 10); its fallback writes their endpoints 2 s
    # after its claim, before the first move.
    await mesh.start_rank(0, *extra)
    await wait_for(lambda: len(peers_held(mesh.log(0))) >= SIZE - 1, "1023 peers on rank 0",
                   timeout, 0.5)  # fmt: skip
    await trio.sleep(5)


async def move_passes(
    lab: Lab,
    mesh: JsonMesh,
    changes: int,
    first: int = 0,
    timeout: float = 30,  # noqa: ASYNC109
) -> list[float]:
    """Move ``changes`` registered endpoints one at a time; rank 0's pass for each (ms).

    Move ``first + n`` picks its rank and new endpoint, so later calls on the same
    mesh move other ranks (a move to the endpoint a rank has already is no change)."""
    passes: list[float] = []
    for n in range(first, first + changes):
        rank = 2 + (n * 97) % (SIZE - 2)
        started = time.time()
        argv = [sys.executable, str(BENCH / "register.py"), "move", "--etcd", lab.etcd_url,
                "--spec", str(mesh.spec_path), "--rank", str(rank),
                "--endpoint", f"198.18.204.{n % 250}:51820"]  # fmt: skip
        await run_ok(lab, lab.pods[1], argv, timeout=timeout)
        await wait_for(lambda r=rank, t=started: _moved(mesh, r, t) is not None,
                       f"rank {rank}'s move on rank 0", timeout, 0.2)  # fmt: skip
        passes.append(_moved(mesh, rank, started) or 0.0)
        await trio.sleep(0.5)
    return passes


async def change_cost(lab: Lab, mesh: JsonMesh, hand: LabProcess, keep: str, changes: int) -> JSON:
    await mesh.daemons[0].stop()  # its entry goes: the next start is the latest
    await seed_members(lab, mesh)
    await start_full(mesh)
    passes = await move_passes(lab, mesh, changes)
    argv = [sys.executable, str(BENCH / "uapi_cost.py"), "--interface", HAND_IF,
            "--peers", str(SIZE - 1), "--repeats", str(changes), "--keep", keep]  # fmt: skip
    raw = json.loads(await run_ok(lab, lab.pods[0], argv, beside=hand, timeout=300))
    return {"vnetd_pass_ms": passes, "uapi": raw}


def _moved(mesh: JsonMesh, rank: int, after: float) -> float | None:
    """The duration of the pass that logged ``rank``'s endpoint move after ``after``."""
    moved = False
    for line in mesh.log(0):
        if line.t < after:
            continue
        if line.message.startswith(f"peer rank {rank} endpoint moved"):
            moved = True
        elif moved and line.message.startswith("plan applied: "):
            return float(line.message.split()[5])
    return None


async def one_run(rounds: int, seconds: float, changes: int) -> JSON:
    async with open_lab(2) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            path = write_spec(lab.workdir / "mesh.toml", SIZE, lab.etcd_url, ttl=10)
            mesh = JsonMesh(lab, path, load_spec(path))
            await mesh.start_rank(0)
            await mesh.start_rank(1)
            await wait_for(lambda: all(len(peers_held(mesh.log(r))) == 1 for r in (0, 1)),
                           "ranks 0 and 1 peered", 60, 0.2)  # fmt: skip
            hand, keep = await hand_devices(lab)
            speeds = await throughput(lab, mesh, rounds, seconds)
            cost = await change_cost(lab, mesh, hand[0], keep, changes)
            nursery.cancel_scope.cancel()
    med = {k: spread(v)["median"] for k, v in speeds.items()}
    ratio = med["vnetd"] / med["hand"] if med["hand"] else None
    print(
        f"  iperf3: vnetd {med['vnetd']:.2f} Gbit/s, hand-made {med['hand']:.2f} Gbit/s "
        f"(ratio {ratio or 0:.3f}), underlay {med['underlay']:.1f} Gbit/s; one change at 1023 "
        f"peers: vnetd pass {spread(cost['vnetd_pass_ms'])['median']:.1f} ms, UAPI update "
        f"{cost['uapi']['ms']['update']:.2f} ms vs full replace {cost['uapi']['ms']['replace']:.1f}"
        " ms",
        flush=True,
    )
    return {"gbps": speeds, "ratio": ratio, **cost, "load": sampler.summary()}


def summarize(runs: list[JSON]) -> JSON:
    return {
        "vnetd_gbps": spread(x for r in runs for x in r["gbps"]["vnetd"]),
        "hand_gbps": spread(x for r in runs for x in r["gbps"]["hand"]),
        "underlay_gbps": spread(x for r in runs for x in r["gbps"]["underlay"]),
        "ratio": spread(r["ratio"] for r in runs),
        "vnetd_pass_ms": spread(x for r in runs for x in r["vnetd_pass_ms"]),
        "uapi_update_ms": spread(x for r in runs for x in r["uapi"]["all_ms"]["update"]),
        "uapi_update_kept_ms": spread(x for r in runs for x in r["uapi"]["all_ms"]["update_kept"]),
        "uapi_update_cpu_ms": spread(x for r in runs for x in r["uapi"]["cpu_ms"]["update"]),
        "uapi_update_kept_cpu_ms": spread(
            x for r in runs for x in r["uapi"]["cpu_ms"]["update_kept"]
        ),
        "uapi_add_remove_ms": spread(x for r in runs for x in r["uapi"]["all_ms"]["add_remove"]),
        "uapi_replace_ms": spread(x for r in runs for x in r["uapi"]["all_ms"]["replace"]),
        "uapi_get_ms": spread(x for r in runs for x in r["uapi"]["all_ms"]["get"]),
        "session_kept_after_update": all(r["uapi"]["session_kept_after_update"] for r in runs),
        "session_kept_after_replace": any(r["uapi"]["session_kept_after_replace"] for r in runs),
        "target_ratio": 0.97,
    }


async def main_async(args: Any) -> int:  # noqa: ANN401
    n = runs_for(args.runs)
    runs, failures = await run_repeated(
        "data plane", n, lambda _i: one_run(args.rounds, args.seconds, args.changes)
    )
    params = {"runs": n, "rounds": args.rounds, "seconds": args.seconds,
              "changes": args.changes, "peers_for_change": SIZE - 1, "mtu": 1420}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs),
                 merge_load([r["load"] for r in runs]), args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(2,), runs=1)
    parser.add_argument("--rounds", type=int, default=4, help="iperf3 tests per side (4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per test (5)")
    parser.add_argument("--changes", type=int, default=10, help="peer changes timed (10)")
    args = parser.parse_args()
    check_host(("ip", "unshare", "nsenter", "etcd", "wireguard-go", "wg", "iperf3", "ping"))
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
