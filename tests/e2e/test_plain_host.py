"""A plain WireGuard host joins: ``vnetd register`` holds its rank, ``vnetd render
wg-quick`` configures it, and it reaches a vnetd rank over the overlay.

Pod 1 runs no vnetd daemon: a bare ``wireguard-go`` configured with ``wg setconf``
from the rendered config (``wg-quick strip``), and ``vnetd register`` beside it.
"""

from __future__ import annotations

import os
import sys
import time

import trio

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, LabProcess, Pod, open_lab

WG_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1", "LOG_LEVEL": "error"}
REACH_BOUND = 10.0
"""Below a second 5 s WireGuard retry after the host's first handshake attempt; the
measured figure (printed) is well under a second."""


async def run_ok(lab: Lab, pod: Pod, argv: list[str], beside: LabProcess | None = None) -> str:
    result = await lab.run(pod, argv, 20, beside=beside)
    assert result.returncode == 0, f"{argv}: {result.stderr.decode()}"
    return result.stdout.decode()


async def plain_wireguard_host(mesh: MeshLab, rank: int, key_file: str) -> LabProcess:
    """wireguard-go in ``rank``'s pod, configured from ``vnetd render wg-quick``."""
    lab, pod = mesh.lab, mesh.pod(rank)
    conf = pod.dir / f"{mesh.spec.interface}.conf"
    await run_ok(lab, pod, [sys.executable, "-m", "vnetd", "render", "wg-quick", "--config",
                            str(mesh.spec_path), "--rank", str(rank), "--private-key-file",
                            key_file, "-o", str(conf)])  # fmt: skip
    stripped = pod.dir / "setconf.conf"
    stripped.write_text(await run_ok(lab, pod, ["wg-quick", "strip", str(conf)]))
    device = await lab.start(pod, ["wireguard-go", "-f", mesh.spec.interface], WG_ENV)
    with trio.fail_after(10):
        while (await lab.run(pod, ["wg", "show", mesh.spec.interface], beside=device)).returncode:
            await trio.sleep(0.05)
    await run_ok(lab, pod, ["wg", "setconf", mesh.spec.interface, str(stripped)], beside=device)
    address = f"{mesh.address(rank)}/{mesh.spec.network.prefixlen}"
    await run_ok(lab, pod, ["ip", "addr", "add", address, "dev", mesh.spec.interface])
    await run_ok(lab, pod, ["ip", "link", "set", mesh.spec.interface, "mtu", "1420", "up"])
    return device


async def ping_until(lab: Lab, pod: Pod, address: str, bound: float) -> float:
    start = time.monotonic()
    with trio.fail_after(bound):
        while (await lab.run(pod, ["ping", "-c", "1", "-W", "0.2", address])).returncode:
            await trio.sleep(0.05)
    return time.monotonic() - start


async def test_plain_wireguard_host_registered_by_vnetd_register():
    with trio.fail_after(90):
        async with open_lab(2) as lab:
            mesh = MeshLab.create(lab)
            host = mesh.pod(1)
            key_file = host.state_dir / "wg.key"
            private = (await trio.run_process(["wg", "genkey"], capture_stdout=True)).stdout
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(private)
            public = (await trio.run_process(["wg", "pubkey"], stdin=private,
                                             capture_stdout=True)).stdout.decode().strip()  # fmt: skip
            await mesh.start_rank(0)
            register = await lab.start(host, [
                sys.executable, "-m", "vnetd", "register", "--config", str(mesh.spec_path),
                "--rank", "1", "--public-key", public,
                "--endpoint", f"{host.underlay_ip}:{mesh.spec.port}",
            ], private_mount=False)  # fmt: skip
            with trio.fail_after(20):
                while await mesh.registered_ranks() != {0, 1}:
                    assert register.returncode is None, register.log_text()
                    await trio.sleep(0.1)
            await plain_wireguard_host(mesh, 1, str(key_file))
            took = await ping_until(lab, host, mesh.address(0), REACH_BOUND)
            print(f"plain WireGuard host reached rank 0 {took:.3f} s after its configuration")
            back = await ping_until(lab, mesh.pod(0), mesh.address(1), 3.0)
            print(f"rank 0 reached the host in {back:.3f} s")
            assert 1 in await mesh.device_ranks(0)

            # SIGTERM revokes the lease: rank 0 drops the host at once, not after the TTL.
            assert await register.stop() == 0, register.log_text()
            stopped = time.monotonic()
            with trio.fail_after(3):
                while 1 in await mesh.device_ranks(0):
                    await trio.sleep(0.05)
            print(f"rank 0 dropped the host {time.monotonic() - stopped:.3f} s after SIGTERM")
            assert "lease revoked; rank 1 released" in register.log_text()
