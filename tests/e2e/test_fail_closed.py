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
import signal
import subprocess
import sys
from pathlib import Path

import trio
from test_dual_stack import NETWORK, NETWORK6, addresses
from test_dual_stack import write_spec as write_dual_stack_spec
from test_faults_process import alive, wait_log

from vnetd.lab.cluster import MeshLab
from vnetd.lab.netns import signal_pid
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


async def unreachable_routes(lab: Lab, pod: Pod, family: str = "-4") -> list[str]:
    result = await run_in(lab, pod, "ip", "-j", family, "route", "show", "type", "unreachable")
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


async def ping_fails_unrouted(lab: Lab, pod: Pod, address: str) -> None:
    """A ping to ``address`` fails at once with "No route to host" (not a timeout)."""
    result = await run_in(lab, pod, "ping", "-c", "1", "-W", "1", address)
    out = (result.stdout + result.stderr).decode()
    assert result.returncode != 0 and "No route to host" in out, (address, out)


async def test_a_killed_daemon_and_an_ipv6_overlay_fail_closed():
    """A dual-stack overlay; pod 0's default routes (IPv4 and IPv6) lead to pod 2, which
    sniffs its eth0 for echo requests to either overlay network. Rank 0's daemon is
    SIGKILLed (its wireguard-go outlives it and keeps the device), then its wireguard-go
    is killed too (the link goes); rank 0 is started again and stopped with SIGTERM. In
    none of these does a ping from pod 0 to an overlay address, present rank or absent,
    leave by eth0: each fails with "No route to host" or goes through the device. The
    sniffer is shown to see such pings once the unreachable routes are removed."""
    with trio.fail_after(240):
        async with open_lab(3, ipv6=True) as lab:
            spec = write_dual_stack_spec(lab.workdir / "ds.toml", lab.etcd_url, 3)
            mesh = MeshLab.create(lab)
            pod, gateway = mesh.pod(0), mesh.pod(2)
            assert gateway.underlay_ip6 is not None
            argv = [sys.executable, SNIFFER, "eth0", f"{NETWORK},{NETWORK6}", "200"]
            sniffer = await lab.start(gateway, argv, private_mount=False)
            await wait_log(sniffer, "ready", 60)
            for family, via in (("-4", gateway.underlay_ip), ("-6", gateway.underlay_ip6)):
                added = await run_in(lab, pod, "ip", family, "route", "add", "default", "via", via)
                assert added.returncode == 0, added.stderr.decode()
            present, absent = addresses(1), addresses(2)

            async def start_rank_0() -> None:
                await wait_log(await mesh.start_rank(0, config=spec), "claimed rank 0 ", 60)
                for address in present:
                    await ping_until_answered(lab, pod, address, timeout=30)

            async def check_closed(when: str) -> None:
                for address in absent:
                    await ping_fails_unrouted(lab, pod, address)
                if not await vnet0_exists(lab, pod):
                    for address in present:
                        await ping_fails_unrouted(lab, pod, address)
                routes = {r for f in ("-4", "-6") for r in await unreachable_routes(lab, pod, f)}
                assert routes == {NETWORK, NETWORK6}, (when, routes)
                assert "seen" not in sniffer.log_text(), f"{when}: an overlay ping left by eth0"

            await mesh.start_rank(1, config=spec)
            await start_rank_0()
            await check_closed("running")
            wg_pid = mesh.wireguard_go_pid(0)
            try:
                mesh.daemons[0].kill()
                assert await mesh.daemons[0].wait(5) == -signal.SIGKILL
                survived = alive(wg_pid)
                print(f"after SIGKILL: wireguard-go alive {survived}, "
                      f"vnet0 present {await vnet0_exists(lab, pod)}")  # fmt: skip
                await check_closed("daemon SIGKILLed")
                if survived:  # the device is wireguard-go's: overlay traffic goes through it
                    for address in present:
                        await ping_until_answered(lab, pod, address, timeout=10)
            finally:
                signal_pid(wg_pid, signal.SIGKILL)
            with trio.fail_after(10):
                while await vnet0_exists(lab, pod):
                    await trio.sleep(0.1)
            await check_closed("daemon and wireguard-go SIGKILLed")

            await start_rank_0()
            assert await mesh.daemons[0].stop() == 0
            assert not await vnet0_exists(lab, pod)
            await check_closed("SIGTERM")

            for family, network, address in (("-4", NETWORK, absent[0]),
                                             ("-6", NETWORK6, absent[1])):  # fmt: skip
                removed = await run_in(
                    lab, pod, "ip", family, "route", "del", "unreachable", network
                )
                assert removed.returncode == 0, removed.stderr.decode()
                await pings_fail(lab, pod, address)
                with trio.fail_after(10):
                    while f" {address}\n" not in sniffer.log_text():
                        await trio.sleep(0.1)


async def vnet0_exists(lab: Lab, pod: Pod) -> bool:
    return (await run_in(lab, pod, "ip", "link", "show", "vnet0")).returncode == 0
