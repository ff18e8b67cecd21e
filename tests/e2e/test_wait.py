"""``vnetd wait`` in the netns lab: real etcd, real ``vnetd up`` daemons, real wireguard-go.

Every ``vnetd wait`` runs inside a pod (never in the root namespace) and
talks only to the lab's etcd; ``--reachable`` runs beside rank 0's daemon,
in its network, mount and UTS namespaces, where its /run/wireguard is.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import trio
from test_rank_holder import grant_lease

from vnetd.control.membership import encode_member, member_key
from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, LabProcess
from vnetd.model import Member


async def vnetd_wait(
    mesh: MeshLab, pod: int, *args: str, limit: float, beside: LabProcess | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``vnetd wait --config <spec> ARGS`` in ``pod``; ``limit`` bounds the process."""
    argv = [sys.executable, "-m", "vnetd", "wait", "--config", str(mesh.spec_path), *args]
    return await mesh.lab.run(mesh.pod(pod), argv, limit, beside=beside)


def public_key() -> str:
    """A well-formed public key no device holds."""
    return base64.b64encode(os.urandom(32)).decode()


def text(result: subprocess.CompletedProcess[bytes]) -> tuple[str, str]:
    return result.stdout.decode(), result.stderr.decode()


async def test_wait_times_out_on_a_missing_rank_then_passes_when_it_joins(lab: Lab) -> None:
    with trio.fail_after(120):
        mesh = MeshLab.create(lab)
        await mesh.start_rank(0)
        await mesh.start_rank(1)
        first = await vnetd_wait(mesh, 0, "--ranks", "0,1", "--timeout", "30", limit=40)
        assert first.returncode == 0, text(first)

        early = await vnetd_wait(mesh, 0, "--ranks", "all", "--timeout", "3", limit=15)
        out, err = text(early)
        assert early.returncode == 1, (out, err)
        assert out == ""
        assert err.splitlines()[-1] == (
            "vnetd: timed out after 3 s: 2/3 ranks registered, missing: 2"
        ), err

        await mesh.start_rank(2)
        done = await vnetd_wait(mesh, 1, "--ranks", "all", "--timeout", "30", limit=40)
        out, err = text(done)
        assert done.returncode == 0, (out, err)
        assert out.startswith("vnetd wait: 3/3 ranks registered after "), out

        peers = await vnetd_wait(mesh, 2, "--min-peers", "2", "--rank", "2", limit=40)
        assert peers.returncode == 0, text(peers)
        assert text(peers)[0].startswith("vnetd wait: 2 peers registered (need 2) after ")

        bad = await vnetd_wait(mesh, 0, "--ranks", "0-3", limit=15)
        assert bad.returncode == 2
        assert text(bad) == (
            "",
            "vnetd: error: --ranks: rank 3 in '0-3' is out of range; "
            "the ranks of this mesh are 0..2\n",
        )
        assert mesh.dead_daemons() == {}


async def test_reachable_needs_a_handshake_with_this_rank(lab: Lab) -> None:
    with trio.fail_after(120):
        mesh = MeshLab.create(lab)
        daemons = {0: await mesh.start_rank(0)}
        first = await vnetd_wait(mesh, 0, "--ranks", "0", "--timeout", "30", limit=40)
        assert first.returncode == 0, text(first)
        # Ranks 1 and 2 registered under keys no device holds: rank 0, registered
        # first, starts a handshake with each (invariant 10) that nothing answers.
        lease = await grant_lease(lab, 600)  # readers skip an entry bound to no lease
        for rank in (1, 2):
            ghost = Member(rank, public_key(), f"{mesh.pod(rank).underlay_ip}:51820", "ghost")
            await lab.etcdctl("put", "--lease", lease, member_key(mesh.spec, rank),
                              encode_member(ghost).decode())  # fmt: skip
        registered = await vnetd_wait(mesh, 0, "--ranks", "all", "--timeout", "30", limit=40)
        assert registered.returncode == 0, text(registered)
        reachable = ["--ranks", "all", "--reachable", "--rank", "0",
                     "--wireguard-dir", "/run/wireguard"]  # fmt: skip

        silent = await vnetd_wait(
            mesh, 0, *reachable, "--timeout", "3", limit=15, beside=daemons[0]
        )
        out, err = text(silent)
        assert silent.returncode == 1, (out, err)
        assert err.splitlines()[-1] == (
            "vnetd: timed out after 3 s: 3/3 ranks registered; "
            "0/2 peers reachable, no handshake: 1, 2"
        ), err

        # Without the daemon's mount namespace there is no device to read: it says so.
        elsewhere = await vnetd_wait(mesh, 0, *reachable, "--timeout", "1", limit=15)
        assert elsewhere.returncode == 1
        assert "no WireGuard device at /run/wireguard/vnet0.sock" in text(elsewhere)[1]

        # The real ranks join: rank 0 starts their handshakes, no traffic needed.
        for rank in (1, 2):
            await lab.etcdctl("del", member_key(mesh.spec, rank))
            daemons[rank] = await mesh.start_rank(rank)
        ready = await vnetd_wait(
            mesh, 0, *reachable, "--timeout", "30", limit=40, beside=daemons[0]
        )
        out, err = text(ready)
        assert ready.returncode == 0, (out, err)
        assert out.startswith("vnetd wait: 3/3 ranks registered; 2/2 peers reachable after "), out
        assert mesh.dead_daemons() == {}
