"""The child of ``test_kernel_thousand.py``: a kernel WireGuard device of 1000 peers driven
through vnetd's ``KernelDataplane`` as the daemon drives it, in the namespace this process
runs in (a fresh one from ``unshare --net``: no netns argument, so the peers' host routes
go through the daemon's own route socket, ``vnetd.dataplane.rtnetlink.route_socket``).

Each phase is timed and checked against what ``ip`` and ``wg`` (C tools, not the code
under test) show; one JSON document of figures and failures goes to stdout. A phase that
raises is recorded with its error and the rest still run where they can, so one run
shows every phase's figure.

Usage: ``python kernel_thousand.py COUNT``
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from ipaddress import ip_interface, ip_network
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.device_reader import read_device
from vnetd.dataplane.kernel.device import KernelDataplane, open_kernel_dataplane, open_wireguard
from vnetd.model import Peer, PeerUpdate, Plan

INTERFACE = "vnet0"
NETWORK = "10.250.0.0/16"


def private_key() -> str:
    raw = X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return base64.b64encode(raw).decode()


def public_key() -> str:
    raw = X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def peer(i: int) -> Peer:
    """Peer ``i`` (0-based): rank ``1 + i``, its /32 and an underlay endpoint that exists
    only as configuration (this namespace has no route to it; nothing is sent)."""
    return Peer(
        public_key(),
        (f"10.250.{i // 250}.{2 + i % 250}/32",),
        f"198.18.{4 + i // 250}.{1 + i % 250}:51820",
        rank=1 + i,
    )


def shown_routes() -> set[str]:
    """The host routes to the device, as ``ip`` shows them (CIDR)."""
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "dev", INTERFACE, "table", "main"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return {f"{r['dst']}/32" if "/" not in r["dst"] else r["dst"] for r in json.loads(out or "[]")}


def shown_endpoints() -> dict[str, str]:
    """Public key -> endpoint, as ``wg show`` shows them."""
    out = subprocess.run(
        ["wg", "show", INTERFACE, "endpoints"], capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout  # fmt: skip
    return dict(line.split("\t") for line in out.splitlines())


class Run:
    """The figures (seconds per phase) and the failures of one run."""

    def __init__(self) -> None:
        self.figures: dict[str, Any] = {}
        self.failures: list[str] = []

    async def phase(self, name: str, fn: Callable[[], Awaitable[object]]) -> bool:
        start = time.monotonic()
        try:
            await fn()
        except Exception:
            self.failures.append(f"{name}: {traceback.format_exc(limit=4)}")
            return False
        finally:
            self.figures[name] = round(time.monotonic() - start, 3)
        return True

    def check(self, name: str, ok: bool, detail: object) -> None:
        if not ok:
            self.failures.append(f"{name}: {detail}")


async def main(count: int) -> Run:
    run = Run()
    config = DeviceConfig(
        interface=INTERFACE,
        private_key=private_key(),
        listen_port=51820,
        address=ip_interface("10.250.255.254/16"),
        network=ip_network(NETWORK),
        mtu=1420,
        max_peers=count + 1,  # as the daemon sets it: its mesh's size less one
    )
    peers = [peer(i) for i in range(count)]
    wanted = {p.allowed_ips[0] for p in peers}
    async with open_kernel_dataplane(config) as dp:
        if not await run.phase("add", lambda: dp.apply(Plan(add=tuple(peers)))):
            return run
        routes = shown_routes()
        run.check("add: routes", routes == wanted, f"{len(routes)} routes, {len(wanted)} wanted")
        endpoints = shown_endpoints()
        run.check("add: endpoints", endpoints == {p.public_key: p.endpoint for p in peers},
                  f"{len(endpoints)} endpoints")  # fmt: skip

        held: dict[str, Any] = {}

        async def dump() -> None:
            held.update(await dp.peers())

        await run.phase("dump", dump)
        run.check("dump", set(held) == {p.public_key for p in peers}, f"{len(held)} peers")

        read: dict[str, Any] = {}

        async def status() -> None:  # what ``vnetd status`` and ``wait --reachable`` read
            read.update((await read_device(INTERFACE, max_peers=count + 1)).peers)

        await run.phase("status read", status)
        run.check("status read", read == held, f"{len(read)} peers read, {len(held)} held")

        # One change among them all: a member leaves, one joins, one moves its endpoint.
        gone, moved, new = peers[0], peers[1], peer(count)
        change = Plan(
            remove=(gone,),
            update=(PeerUpdate(moved.public_key, endpoint="198.18.3.1:51821"),),
            add=(new,),
        )
        if await run.phase("one change", lambda: dp.apply(change)):
            routes = shown_routes()
            run.check("one change: routes", routes == wanted - set(gone.allowed_ips)
                      | set(new.allowed_ips), f"{len(routes)} routes")  # fmt: skip
            endpoints = shown_endpoints()
            run.check("one change: endpoints", gone.public_key not in endpoints
                      and endpoints.get(moved.public_key) == "198.18.3.1:51821"
                      and endpoints.get(new.public_key) == new.endpoint,
                      f"{len(endpoints)} endpoints")  # fmt: skip

        # A daemon restarted after SIGKILL finds the link with all its peers and adopts it.
        again = KernelDataplane(config, None, open_wireguard)
        adopted: list[bool] = []

        async def adopt() -> None:
            adopted.append(await again.open())

        if await run.phase("adopt", adopt):
            run.check("adopt", adopted == [True], adopted)
            run.check("adopt: routes kept", len(shown_routes()) == count, "routes changed")
        again.close_routes()
    return run


if __name__ == "__main__":
    result = trio.run(main, int(sys.argv[1]))
    print(json.dumps({"figures": result.figures, "failures": result.failures}))
