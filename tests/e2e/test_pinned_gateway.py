"""A pinned gateway rank, against real etcd and wireguard-go in the sites lab.

Site b's gateways are ranks 2 and 3, and the spec pins rank 2's record signing key
(``[sites.b] gateway_keys``, made beforehand with ``vnetd signing-key --create`` in
pod 2's state dir). While rank 2 is free, a writer registers it under its own lease
with its own WireGuard key (a real wireguard-go device in pod 2, reachable through
the forwarded port) and its own signing key: without the pin every daemon of site a
would route site b's ranks to it (rank 2 is the lowest gateway present). With the
pin no daemon takes it, nothing reaches the intruder's device, the forgery is
reported, site b stays reached through gateway 3, and a daemon that tries rank 2
with another key exits 2. The real gateway then starts with the pinned key, takes
its rank over, and carries site b's traffic. Unit twin: tests/unit/test_gateway_pins.py.

A gateway whose pinned key is in a file of its own (``--signing-key-file``, as a
mounted Secret gives it) keeps its rank when its pod comes back with an empty state
dir; without the file it exits 2 (tests/unit/test_signing_key_file.py).
"""

from __future__ import annotations

import signal
import sys
import time

import trio
from test_rank_holder import Intruder, grant_lease
from test_sites import gatewayed_mesh, overlay_routed, reaches, start_in_site

from vnetd.control.membership import encode_member, member_key
from vnetd.control.proof import Signer
from vnetd.lab.cluster import MeshLab
from vnetd.lab.netns import signal_pid
from vnetd.lab.pods import LabProcess
from vnetd.lab.sites import SitesLab, open_sites_lab
from vnetd.model import Member

WATCH_ROOM = 4.0
"""How long the forgery is watched for a wrong plan: a watch event reaches every
daemon in milliseconds here, and a handshake to a peer added goes out at once."""
FORMED_BOUND = 20.0
"""From a start to a ping across the sites: below the 4 x 5 s of a handshake retried
at each WireGuard retry interval."""


async def pinned_mesh(lab: SitesLab) -> tuple[MeshLab, str]:
    """Site a's gateway is 0, site b's are 2 and 3, rank 2 pinned to a key made now in
    pod 2's state dir; the gateways forwarded and forwarding. Returns the mesh and the
    pinned key."""
    with trio.fail_after(30):
        made = await trio.run_process(
            [sys.executable, "-m", "vnetd", "signing-key", "--create",
             "--state-dir", str(lab.pods[2].state_dir)],
            capture_stdout=True,
        )  # fmt: skip
    pinned = made.stdout.decode().strip()
    mesh = await gatewayed_mesh(lab, {"a": [0], "b": [2, 3]}, pins={"b": {2: pinned}})
    assert mesh.spec.pinned_key(2) == pinned
    return mesh, pinned


async def ping_until(mesh: MeshLab, source: int, target: int, bound: float) -> None:
    with trio.fail_after(bound):
        while not await reaches(mesh.lab, mesh.pod(source), mesh.address(target)):
            await trio.sleep(0.2)


async def key_holding(mesh: MeshLab, rank: int, target: int) -> str | None:
    """The public key of the peer on ``rank``'s device that holds ``target``'s /32."""
    ip = f"{mesh.address(target)}/32"
    return next((k for k, ips in (await mesh.device_peers(rank)).items() if ip in ips), None)


async def test_a_forged_pinned_gateway_carries_nothing_and_the_real_one_does() -> None:
    with trio.fail_after(180):
        async with open_sites_lab({"a": 2, "b": 4}) as lab:
            mesh, pinned = await pinned_mesh(lab)
            for rank in (3, 4, 5, 1, 0):
                await start_in_site(mesh, lab, rank)
                await overlay_routed(mesh, rank)
            await ping_until(mesh, 0, 4, FORMED_BOUND)
            await ping_until(mesh, 1, 5, FORMED_BOUND)
            gateway3 = await key_holding(mesh, 0, 4)
            assert gateway3 is not None and gateway3 == await key_holding(mesh, 0, 3)

            # A daemon for rank 2 with a signing key of its own refuses to start.
            other_state = lab.pods[2].dir / "other-state"
            argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path),
                    "--rank", "2", "--state-dir", str(other_state), "--site", "b"]  # fmt: skip
            refused = await lab.start(mesh.pod(2), argv, {"POD_IP": mesh.pod(2).underlay_ip})
            assert await refused.wait(30) == 2
            assert "sites.b.gateway_keys.2 pins its signing key" in refused.log_text()

            # The forgery: rank 2 under the intruder's lease, keys and forwarded port.
            intruder = Intruder(mesh)
            rank0_key = await key_holding(mesh, 1, 0)
            assert rank0_key is not None
            await intruder.start(rank0_key)
            signer = Signer.generate()
            lease = await grant_lease(lab, 120)
            forged = Member(
                2, intruder.public_key, f"{mesh.pod(2).underlay_ip}:51820", "intruder",
                time.time(), "x", site="b", public_endpoint=lab.public_endpoint(mesh.pod(2)),
                signing_key=signer.public_key,
            )  # fmt: skip
            key2 = member_key(mesh.spec, 2)
            value = encode_member(forged, signer, key=key2, lease=int(lease, 16))
            await lab.etcdctl("put", "--lease", lease, key2, value.decode())

            deadline = trio.current_time() + WATCH_ROOM
            while trio.current_time() < deadline:
                for rank in (0, 1, 4):
                    peers = await mesh.device_peers(rank)
                    assert intruder.public_key not in peers, (rank, peers)
                assert await key_holding(mesh, 0, 4) == gateway3
                await trio.sleep(0.2)
            assert await intruder.received() == 0
            assert await reaches(lab, mesh.pod(0), mesh.address(4))
            for rank in (0, 1):
                log = mesh.daemons[rank].log_text()
                assert "rank 2 is a gateway whose signing key is pinned" in log, log[-1500:]

            # The real gateway: the pinned key's state dir. It takes rank 2 over and
            # site a reaches site b through it.
            assert intruder.process is not None
            await intruder.process.stop()
            await start_in_site(mesh, lab, 2)
            with trio.fail_after(FORMED_BOUND):
                while (await key_holding(mesh, 0, 4)) in (None, gateway3):
                    await trio.sleep(0.2)
            gateway2 = await key_holding(mesh, 0, 4)
            assert gateway2 == await key_holding(mesh, 0, 2) != intruder.public_key
            await ping_until(mesh, 0, 4, FORMED_BOUND)
            await ping_until(mesh, 1, 5, FORMED_BOUND)
            log2 = mesh.daemons[2].log_text()
            assert "took over an entry not signed by the rank's pinned key" in log2, log2[-1500:]
            entry = await lab.etcdctl("get", "--print-value-only", key2)
            assert f'"signing_key":"{pinned}"' in entry.stdout.decode()
            assert not mesh.dead_daemons()


async def test_a_gateway_with_a_fresh_state_dir_and_its_key_file_keeps_its_rank() -> None:
    """Site b's only gateway, rank 1, pinned to a key made with ``vnetd signing-key
    --create --key-file`` (as a Secret would hold it). Its pod dies whole (daemon and
    wireguard-go SIGKILLed, its lease still live) and comes back with an empty state dir
    (a rescheduled pod's new ``emptyDir``): without the key file it exits 2 naming the
    pin; with the file (``VNETD_SIGNING_KEY_FILE`` this time) it claims rank 1 again,
    with a new WireGuard key, and site a reaches site b through it."""
    with trio.fail_after(150):
        async with open_sites_lab({"a": 1, "b": 2}) as lab:
            key_file = lab.workdir / "gateway-1.key"
            with trio.fail_after(30):
                made = await trio.run_process(
                    [sys.executable, "-m", "vnetd", "signing-key", "--create",
                     "--key-file", str(key_file)],
                    capture_stdout=True,
                )  # fmt: skip
            pinned = made.stdout.decode().strip()
            assert key_file.stat().st_mode & 0o777 == 0o600
            mesh = await gatewayed_mesh(lab, {"a": [0], "b": [1]}, pins={"b": {1: pinned}})
            gateway = mesh.pod(1)

            async def start_gateway(state: str, *flags: str, env: dict[str, str]) -> LabProcess:
                argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path),
                        "--rank", "1", "--state-dir", str(gateway.dir / state), "--site", "b",
                        "--public-endpoint", str(lab.public_endpoint(gateway)), *flags]  # fmt: skip
                process = await lab.start(
                    gateway, argv, {"POD_IP": gateway.underlay_ip, "POD_NAME": gateway.name, **env}
                )
                mesh.daemons[1] = process
                return process

            for rank in (2, 0):
                await start_in_site(mesh, lab, rank)
                await overlay_routed(mesh, rank)
            await start_gateway("state-1", "--signing-key-file", str(key_file), env={})
            await ping_until(mesh, 0, 2, FORMED_BOUND)
            first = await key_holding(mesh, 0, 2)
            assert first is not None and first == await key_holding(mesh, 0, 1)
            assert f"record signing key {pinned} from --signing-key-file" in (
                mesh.daemons[1].log_text()
            )

            # The pod dies whole; its entry stays under its live lease for up to a TTL.
            wireguard = mesh.wireguard_go_pid(1)
            mesh.daemons[1].kill()
            signal_pid(wireguard, signal.SIGKILL)
            assert await mesh.daemons[1].wait(5) == -signal.SIGKILL
            with trio.fail_after(10):
                while (await lab.run(gateway, ["ip", "link", "show", "vnet0"])).returncode == 0:
                    await trio.sleep(0.1)

            # Rescheduled with an empty state dir and nothing else: a new signing key.
            fresh = await start_gateway("state-2", env={})
            assert await fresh.wait(30) == 2
            assert "sites.b.gateway_keys.1 pins its signing key" in fresh.log_text()

            # Rescheduled with the key file: rank 1 again, under its pinned key.
            back = await start_gateway("state-3", env={"VNETD_SIGNING_KEY_FILE": str(key_file)})
            with trio.fail_after(FORMED_BOUND):
                while (await key_holding(mesh, 0, 2)) in (None, first):
                    await trio.sleep(0.2)
            second = await key_holding(mesh, 0, 2)
            assert second == await key_holding(mesh, 0, 1) != first  # a new WireGuard key
            await ping_until(mesh, 0, 2, FORMED_BOUND)
            await ping_until(mesh, 2, 0, FORMED_BOUND)
            entry = await lab.etcdctl("get", "--print-value-only", member_key(mesh.spec, 1))
            assert f'"signing_key":"{pinned}"' in entry.stdout.decode()
            assert not (gateway.dir / "state-3" / "signing.key").exists()
            for rank in (0, 2):
                log = mesh.daemons[rank].log_text()
                assert "rank 1 is a gateway whose signing key is pinned" not in log, log[-1500:]
            assert back.returncode is None and not mesh.dead_daemons()
