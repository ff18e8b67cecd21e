#!/usr/bin/env python3
"""The kernel data plane's own costs at 1000 peers, measured in the kernel guest.

``KernelDataplane`` alone (no daemon, no etcd) in a namespace of the guest that the
script makes (``kbench``) and runs itself in, as the daemon runs in its pod's: 1000
adds in one plan, a dump, three endpoint updates, one removal (which reads the
device back), one add, then 1000 removals in one plan; each with its wall time and
the process's CPU time (all threads: the netlink work runs in a worker thread).
``--profile`` adds cProfile's top functions (of the event loop's thread only).

Run: ``scripts/guest -- .venv/bin/python bench/kernel_netlink.py [--profile]``. The
guest has no network device; the peers' endpoints answer nothing.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import io
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from ipaddress import ip_interface, ip_network

import trio

from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.kernel.device import open_kernel_dataplane
from vnetd.model import Peer, PeerUpdate, Plan

NETNS = "kbench"
PEERS = 1000


def key_of(n: int) -> str:
    return base64.b64encode(n.to_bytes(4, "big") + bytes([7] * 28)).decode()


def peer(n: int) -> Peer:
    ip = f"10.250.{n // 250}.{n % 250 + 2}/32"
    return Peer(key_of(n), (ip,), f"198.18.{100 + n // 250}.{n % 250 + 1}:51820")


async def timed(name: str, fn: Callable[[], Awaitable[object]], profile: bool) -> None:
    prof = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    await fn()
    if prof:
        prof.disable()
    print(
        f"{name}: wall {1000 * (time.perf_counter() - wall):.1f} ms, "
        f"cpu {1000 * (time.process_time() - cpu):.1f} ms",
        flush=True,
    )
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
        print(out.getvalue(), flush=True)


async def inner(profile: bool) -> None:
    config = DeviceConfig(
        interface="vnet0",
        private_key=base64.b64encode(bytes([9] * 32)).decode(),
        listen_port=51820,
        address=ip_interface("10.250.0.1/16"),
        network=ip_network("10.250.0.0/16"),
        mtu=1420,
        max_peers=PEERS,
    )
    peers = [peer(n) for n in range(PEERS)]
    async with open_kernel_dataplane(config) as dp:
        await timed(f"add {PEERS}", lambda: dp.apply(Plan(add=tuple(peers))), profile)
        await timed(f"dump {PEERS}", dp.peers, profile)
        for n in range(3):
            upd = PeerUpdate(peers[n].public_key, f"198.18.204.{n}:51820")
            await timed(
                f"one endpoint update #{n}",
                lambda u=upd: dp.apply(Plan(update=(u,))),
                profile and n == 1,
            )
        await timed("one removal", lambda: dp.apply(Plan(remove=(peers[0],))), profile)
        await timed("one add", lambda: dp.apply(Plan(add=(peers[0],))), False)
        await timed(f"remove {PEERS}", lambda: dp.apply(Plan(remove=tuple(peers))), profile)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--inner", action="store_true")
    args = parser.parse_args()
    if args.inner:
        trio.run(inner, args.profile)
        return
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        argv = [sys.executable, __file__, "--inner"] + (["--profile"] if args.profile else [])
        sys.exit(subprocess.run(["ip", "netns", "exec", NETNS, *argv], timeout=900).returncode)
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


if __name__ == "__main__":
    main()
