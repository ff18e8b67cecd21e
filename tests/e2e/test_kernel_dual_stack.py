"""Kernel WireGuard ranks with a dual-stack overlay over an IPv6 underlay, ``mtu = "auto"``,
and a rank that moves to a new underlay address (marked ``kernel``: where the host's
kernel lacks the module, this runs in the QEMU kernel guest, ``tests/kernel_guest.py``).

One lab of two pods (each lab costs tens of seconds under TCG, so the three scenarios
share it), both ranks ``--dataplane kernel`` with IPv6 endpoints, the underlay at MTU
1400 and dropping IP fragments (as ``test_mtu_ipv6.py``):

- Both ranks hold their IPv4 and IPv6 overlay addresses on the kernel device, both
  networks routed ``unreachable``, a host route per peer address in each family, and
  the peer's /32 and /128 as its allowed IPs with its IPv6 endpoint (what
  ``test_dual_stack.py`` asserts on wireguard-go); pings cross in both families.
- ``mtu = "auto"`` sets the device to 1400 - 80 (the IPv6 overhead) = 1320, and a ping
  of the full 1320 bytes with DF crosses in each family: one byte more on the underlay
  than it carries would be fragmented and dropped.
- Rank 1's daemon is killed, its pod moves to a new IPv6 underlay address and the
  daemon restarts there (it adopts its link): rank 0 writes the new endpoint to its
  kernel device (the log says so; WireGuard's own roaming alone would not write that
  line) and the pings cross again in both families.

Under TCG the guest runs Python about 20 times slower than the host: the waits are hang
guards, not bounds; the figures are printed.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from test_dual_stack import (
    NETWORK,
    NETWORK6,
    addresses,
    allowed_ips,
    check_device_addresses,
    check_routes,
    expected_allowed,
)
from test_fail_closed import ping_until_answered, run_in
from test_faults_process import wait_log
from test_kernel_mesh import link_index
from test_mtu_ipv6 import device_mtu, drop_fragments

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.lab.underlay import UNDERLAY6_PREFIX

RANKS = 2
UNDERLAY_MTU = 1400
OVERLAY_MTU = UNDERLAY_MTU - 80
HEADERS = (28, 48)
"""IP and ICMP headers of a ping in each family: 20 + 8, 40 + 8."""
MOVED_TO = f"{UNDERLAY6_PREFIX}65"
TTL = 60
"""Longer than a restart takes in the guest, so the killed daemon's entry is still there
and the restarted one takes it over (its endpoint moves; it never leaves)."""
HANG = 580.0
"""The whole walk, a hang guard below the guest's per-test 600 s (``GUEST_TEST_TIMEOUT``)."""
PING = 60.0


def write_spec(path: Path, etcd_url: str) -> Path:
    path.write_text(
        f"""[mesh]
name = "kds"
size = {RANKS}
network = "{NETWORK}"
network6 = "{NETWORK6}"
interface = "vnet0"
mtu = "auto"

[registry]
endpoints = ["{etcd_url}"]
lease_ttl = {TTL}
"""
    )
    return path


def endpoint(ip6: str) -> str:
    return f"[{ip6}]:51820"


async def move_ip6(lab: Lab, rank: int, new: str) -> None:
    """Give pod ``rank`` the IPv6 underlay address ``new`` instead of its own."""
    pod = lab.pods[rank]
    for argv in (
        ("ip", "-6", "addr", "del", f"{pod.underlay_ip6}/64", "dev", "eth0"),
        ("ip", "-6", "addr", "add", f"{new}/64", "dev", "eth0", "nodad"),
    ):
        result = await run_in(lab, pod, *argv)
        assert result.returncode == 0, result.stderr.decode()
    lab.pods[rank] = replace(pod, underlay_ip6=new)


async def endpoints_on(lab: Lab, rank: int) -> dict[str, str]:
    """Public key -> endpoint of each peer on ``rank``'s kernel device."""
    result = await run_in(lab, lab.pods[rank], "wg", "show", "vnet0", "endpoints")
    assert result.returncode == 0, result.stderr.decode()
    return dict(line.split("\t") for line in result.stdout.decode().splitlines())


async def own_key(lab: Lab, rank: int) -> str:
    result = await run_in(lab, lab.pods[rank], "wg", "show", "vnet0", "public-key")
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().strip()


async def ping_both_ways(mesh: MeshLab) -> None:
    for a in range(RANKS):
        for address in addresses(1 - a):
            await ping_until_answered(mesh.lab, mesh.pod(a), address, timeout=PING)


async def start_kernel_rank(mesh: MeshLab, rank: int, spec: Path) -> None:
    ip6 = mesh.pod(rank).underlay_ip6
    assert ip6 is not None
    argv = ("--dataplane", "kernel", "--endpoint", endpoint(ip6))
    await mesh.start_rank(rank, *argv, config=spec)


@pytest.mark.kernel
async def test_kernel_ranks_dual_stack_over_ipv6_with_auto_mtu_then_one_moves() -> None:
    with trio.fail_after(HANG):
        async with open_lab(RANKS, mtu=UNDERLAY_MTU, ipv6=True) as lab:
            await drop_fragments(lab)
            mesh = MeshLab.create(lab)
            spec = write_spec(lab.workdir / "kds.toml", lab.etcd_url)
            started = time.monotonic()
            for rank in (1, 0):
                await start_kernel_rank(mesh, rank, spec)
            for rank in range(RANKS):
                await wait_log(mesh.daemons[rank], "kernel wireguard link up", HANG)
            await ping_both_ways(mesh)
            print(f"both families answered {time.monotonic() - started:.1f} s after the start")

            for rank in range(RANKS):
                daemon, pod = mesh.daemons[rank], mesh.pod(rank)
                assert await allowed_ips(lab, rank, daemon) == expected_allowed(rank, RANKS)
                await check_routes(lab, rank, RANKS)
                await check_device_addresses(lab, rank)
                peer_ip6 = mesh.pod(1 - rank).underlay_ip6
                assert peer_ip6 is not None
                assert list((await endpoints_on(lab, rank)).values()) == [endpoint(peer_ip6)]
                assert await device_mtu(lab, pod) == OVERLAY_MTU
                line = f"mtu auto: {OVERLAY_MTU} (underlay eth0 mtu {UNDERLAY_MTU} minus 80 "
                assert line + "for an IPv6 endpoint)" in daemon.log_text()
                for address, headers in zip(addresses(1 - rank), HEADERS, strict=True):
                    size = str(OVERLAY_MTU - headers)
                    full = await run_in(lab, pod, "ping", "-c", "1", "-W", "5", "-M", "do",
                                        "-s", size, address)  # fmt: skip
                    assert full.returncode == 0, (address, full.stdout + full.stderr)

            # Rank 1 moves: killed, a new underlay address, restarted there.
            old, moved = endpoint(str(mesh.pod(1).underlay_ip6)), endpoint(MOVED_TO)
            key1, index = await own_key(lab, 1), await link_index(mesh, 1)
            await mesh.daemons[1].stop(signal.SIGKILL)
            await move_ip6(lab, 1, MOVED_TO)
            killed = time.monotonic()
            await start_kernel_rank(mesh, 1, spec)
            await wait_log(mesh.daemons[1], "link adopted (same key)", HANG)
            assert await link_index(mesh, 1) == index, "adopted, not created anew"
            await wait_log(mesh.daemons[0], f"peer rank 1 endpoint moved from {old} to {moved}",
                           HANG)  # fmt: skip
            assert (await endpoints_on(lab, 0))[key1] == moved
            await ping_both_ways(mesh)
            print(f"rank 1 moved to {moved}: both families answered again "
                  f"{time.monotonic() - killed:.1f} s after the kill")  # fmt: skip
            assert "peer left" not in mesh.daemons[0].log_text()
            for daemon in mesh.daemons.values():
                assert "Traceback" not in daemon.log_text()
