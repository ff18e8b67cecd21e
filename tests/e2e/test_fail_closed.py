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
import sys
from pathlib import Path

import trio
from test_faults_process import wait_log

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


SNIFFER = str(Path(__file__).parent / "sniff_icmp.py")
SNIFF_SECONDS = 90.0
"""Longer than the test's own bound: the sniffer is stopped by the lab's teardown."""


async def pings_fail(lab: Lab, pod: Pod, address: str) -> bool:
    result = await run_in(lab, pod, "ping", "-c", "2", "-i", "0.2", "-W", "1", address)
    return result.returncode != 0


async def test_a_route_to_the_overlay_network_made_before_vnetd_carries_no_overlay_packet():
    """Pod 0 routes the whole overlay network via pod 2 before vnetd starts (an admin's
    or a CNI's route); pod 2 sniffs its eth0. vnetd must route the network unreachable
    over that route, so pings to absent ranks never reach pod 2, while it runs and after
    SIGTERM. The sniffer is shown to see such pings once the route is put back."""
    with trio.fail_after(120):
        async with open_lab(3) as lab:
            mesh = MeshLab.create(lab)
            pod, gateway = mesh.pod(0), mesh.pod(2)
            network = str(mesh.spec.network)
            via = ["ip", "route", "add", network, "via", gateway.underlay_ip]
            added = await run_in(lab, pod, *via)
            assert added.returncode == 0, added.stderr.decode()
            argv = [sys.executable, SNIFFER, "eth0", network, str(SNIFF_SECONDS)]
            sniffer = await lab.start(gateway, argv, private_mount=False)
            await wait_log(sniffer, "ready", 60)

            await mesh.start_rank(0)
            await wait_log(mesh.daemons[0], "claimed rank 0 ", 60)
            for absent in (1, 2):
                assert await pings_fail(lab, pod, mesh.address(absent))
                code, route = await route_get(lab, pod, mesh.address(absent))
                assert code != 0 and "No route to host" in route, route
            assert "a route to the overlay network via" in mesh.daemons[0].log_text()
            assert await mesh.daemons[0].stop() == 0
            assert await pings_fail(lab, pod, mesh.address(1))
            code, route = await route_get(lab, pod, mesh.address(1))
            print(f"vnetd stopped: ip route get {mesh.address(1)}: {route!r}")
            assert code != 0 and "No route to host" in route, route
            assert "seen" not in sniffer.log_text(), "an overlay ping left pod 0 by eth0"

            removed = await run_in(lab, pod, "ip", "route", "del", "unreachable", network)
            assert removed.returncode == 0, removed.stderr.decode()
            assert (await run_in(lab, pod, *via)).returncode == 0
            await pings_fail(lab, pod, mesh.address(1))
            with trio.fail_after(10):
                while "seen" not in sniffer.log_text():
                    await trio.sleep(0.1)
