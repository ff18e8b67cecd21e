#!/usr/bin/env python3
"""How long one UAPI ``set`` that adds peers with an immediate handshake takes.

    uapi_handshake.py --endpoints unresolved --sizes 10,50,100,300 [--chunk 0]

A lab of one pod runs a hand-made wireguard-go (``wgb0``, up, with a key and
port); beside it, the inner run adds batches of peers the way vnetd's
initiator does (``plan_lines`` with endpoint and keepalive, then
``handshake_lines``), each batch one ``set`` (or ``--chunk`` peers per
``set``), batches one after the other, so each finds the earlier ones still
waiting for a handshake that never comes. Endpoints are:

- ``unresolved``: on-link underlay addresses (198.18.200.0 and up) where no
  host answers ARP, as bench/footprint.py's fake members have;
- ``local``: the pod's own address, a port where nothing listens (the
  neighbour is resolved; the kernel answers port-unreachable);
- ``pinned``: as ``unresolved``, with each address's neighbour pinned to a MAC
  no port of the lab's bridge has (a host that exists and does not answer:
  the frames go out at once and the bridge floods them inside the lab).

Prints one JSON line per batch: peers in the batch, peers already on the
device, the ``set`` time in ms, and the pod's incomplete neighbour entries.
Nothing leaves the lab's namespaces.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

import trio
from register import random_public_key

from vnetd.dataplane.codec.uapi_protocol import plan_lines
from vnetd.dataplane.wireguard_go.device import handshake_lines
from vnetd.dataplane.wireguard_go.uapi_client import UapiClient
from vnetd.model import Peer, Plan

HAND_IF = "wgb0"
KEEPALIVE = 25


def endpoint(kind: str, i: int, own_ip: str) -> str:
    if kind == "local":
        return f"{own_ip}:{40000 + i}"
    return f"198.18.{200 + i // 256}.{i % 256}:51820"


def unresolved_neighbours() -> int:
    out = subprocess.run(["ip", "-4", "neigh", "show", "dev", "eth0"], capture_output=True,
                         text=True, timeout=10).stdout  # fmt: skip
    return sum(1 for line in out.splitlines() if "INCOMPLETE" in line or "FAILED" in line)


def udp_send_queue() -> int:
    """Bytes the device's IPv4 UDP socket has queued but not yet sent (``ss``'s ``w``)."""
    out = subprocess.run(["ss", "-4uanm", "sport", "=", ":51821"], capture_output=True,
                         text=True, timeout=10).stdout  # fmt: skip
    found = re.search(r"skmem:\(r\d+,rb\d+,t(\d+),tb(\d+)", out)
    return int(found.group(1)) if found else -1


def pin_neighbours() -> None:
    """Pin the neighbour of every ``unresolved`` endpoint to a MAC no lab port has."""
    pin = "".join(
        f"neigh replace {endpoint('unresolved', i, '').split(':')[0]} "
        "lladdr 02:00:00:00:00:01 nud permanent dev eth0\n"
        for i in range(1024)
    )
    subprocess.run(["ip", "-batch", "-"], input=pin, text=True, check=True, timeout=60)


def note(path: str, record: dict[str, object]) -> None:
    with open(path, "a") as progress:
        print(json.dumps(record), file=progress)


async def inner(args: argparse.Namespace) -> None:
    uapi = UapiClient(f"/run/wireguard/{HAND_IF}.sock", timeout=300)
    if args.endpoints == "pinned":
        pin_neighbours()
    added = 0
    for size in (int(s) for s in args.sizes.split(",")):
        peers = tuple(
            Peer(
                random_public_key(),
                (f"10.252.{(added + i) // 256}.{(added + i) % 256}/32",),
                endpoint(args.endpoints, added + i, args.own_ip),
            )  # fmt: skip
            for i in range(size)
        )
        chunk = args.chunk or size
        times = []
        started = time.perf_counter()
        for first in range(0, size, chunk):
            part = peers[first : first + chunk]
            plan = Plan(add=part, handshake=tuple(p.public_key for p in part))
            lines = plan_lines(plan, KEEPALIVE) + handshake_lines(plan.handshake, KEEPALIVE)
            t0 = time.perf_counter()
            await uapi.set(lines)
            times.append(round((time.perf_counter() - t0) * 1000, 1))
            if args.progress:
                note(args.progress, {"before": added + first, "peers": len(part),
                                     "set_ms": times[-1], "at": time.time(),
                                     "udp_wmem": udp_send_queue()})  # fmt: skip
        total = (time.perf_counter() - started) * 1000
        t0 = time.perf_counter()
        await uapi.get()
        get_ms = (time.perf_counter() - t0) * 1000
        print(json.dumps({"endpoints": args.endpoints, "batch": size, "before": added,
                          "set_ms": round(total, 1), "chunk_ms": times,
                          "get_ms": round(get_ms, 1),
                          "unresolved_neigh": unresolved_neighbours(),
                          "udp_wmem": udp_send_queue()}), flush=True)  # fmt: skip
        added += size
        await trio.sleep(args.pause)


async def outer(args: argparse.Namespace) -> None:
    from dataplane import run_ok, wg_keypair

    from vnetd.lab.open_lab import open_lab

    async with open_lab(1, with_etcd=False) as lab:
        pod = lab.pods[0]
        env = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1", "LOG_LEVEL": "error"}
        device = await lab.start(pod, ["wireguard-go", "-f", HAND_IF], env)
        key_file = pod.dir / "hand.key"
        key_file.write_text(wg_keypair()[0] + "\n")
        key_file.chmod(0o600)
        for _ in range(100):
            result = await lab.run(pod, ["wg", "show", HAND_IF], beside=device)
            if result.returncode == 0:
                break
            await trio.sleep(0.1)
        await run_ok(lab, pod, ["wg", "set", HAND_IF, "private-key", str(key_file),
                                "listen-port", "51821"], beside=device)  # fmt: skip
        await run_ok(lab, pod, ["ip", "link", "set", HAND_IF, "up"], beside=device)
        argv = [sys.executable, __file__, "--inner", "--endpoints", args.endpoints,
                "--sizes", args.sizes, "--chunk", str(args.chunk), "--pause", str(args.pause),
                "--own-ip", str(pod.underlay_ip), "--progress", args.progress]  # fmt: skip
        with trio.move_on_after(args.budget):
            print(await run_ok(lab, pod, argv, beside=device, timeout=args.budget + 60), end="",
                  flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--own-ip", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--endpoints", choices=("unresolved", "local", "pinned"), default="unresolved"
    )
    parser.add_argument("--sizes", default="10,50,100,300")
    parser.add_argument("--chunk", type=int, default=0, help="peers per set (0: one set)")
    parser.add_argument("--progress", default="", help="append a JSON line per set here")
    parser.add_argument("--budget", type=float, default=300, help="stop after this many s")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between batches")
    args = parser.parse_args()
    trio.run(inner if args.inner else outer, args)


if __name__ == "__main__":
    main()
