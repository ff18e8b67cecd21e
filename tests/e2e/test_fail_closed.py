"""While vnetd is down the overlay fails closed: its unreachable route stays.

A pod's application keeps running while its vnetd sidecar restarts. The
overlay network's ``unreachable`` route has no device, so it outlives the
link; were it removed on SIGTERM, a packet to a peer's overlay address
would follow the pod's default route into the cluster network. Here pod 0
has a default route (to an address nobody holds: ``ip route get`` sends
nothing), its vnetd gets SIGTERM, and the route to a peer's overlay address
must still be "No route to host"; started again, vnetd keeps the route and
the peer answers pings again.
"""

from __future__ import annotations

import json
import subprocess

import trio

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, Pod, open_lab

GATEWAY = "198.18.0.1"
"""On pod 0's underlay link, held by no namespace: a default route that goes nowhere."""


async def run_in(lab: Lab, pod: Pod, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return await lab.run(pod, list(argv), timeout=10)


async def route_get(lab: Lab, pod: Pod, address: str) -> tuple[int, str]:
    result = await run_in(lab, pod, "ip", "route", "get", address)
    return result.returncode, (result.stdout + result.stderr).decode().strip()


async def ping_until_answered(lab: Lab, pod: Pod, address: str, timeout: float) -> None:  # noqa: ASYNC109
    with trio.fail_after(timeout):
        while (await run_in(lab, pod, "ping", "-c", "1", "-W", "1", address)).returncode != 0:
            await trio.sleep(0.2)


async def unreachable_routes(lab: Lab, pod: Pod) -> list[str]:
    result = await run_in(lab, pod, "ip", "-j", "route", "show", "type", "unreachable")
    return [str(route["dst"]) for route in json.loads(result.stdout or b"[]")]


async def test_overlay_stays_unreachable_while_vnetd_is_down():
    with trio.fail_after(120):
        async with open_lab(2) as lab:
            mesh = MeshLab.create(lab)
            pod, peer = mesh.pod(0), mesh.address(1)
            added = await run_in(lab, pod, "ip", "route", "add", "default", "via", GATEWAY)
            assert added.returncode == 0, added.stderr.decode()
            for rank in (0, 1):
                await mesh.start_rank(rank)
            await ping_until_answered(lab, pod, peer, timeout=30)
            code, route = await route_get(lab, pod, peer)
            assert code == 0 and "dev vnet0" in route, route

            assert await mesh.daemons[0].stop() == 0
            code, route = await route_get(lab, pod, peer)
            print(f"vnetd stopped: ip route get {peer}: {route!r}")
            assert code != 0 and "No route to host" in route, "fails closed, not via eth0"
            assert GATEWAY not in route
            assert await unreachable_routes(lab, pod) == [str(mesh.spec.network)]
            link = await run_in(lab, pod, "ip", "link", "show", "vnet0")
            assert link.returncode != 0, "the link itself is gone"

            await mesh.start_rank(0)
            await ping_until_answered(lab, pod, peer, timeout=30)
            code, route = await route_get(lab, pod, peer)
            assert code == 0 and "dev vnet0" in route, route
            assert await unreachable_routes(lab, pod) == [str(mesh.spec.network)], "kept, once"
            assert "Traceback" not in mesh.daemons[0].log_text()
