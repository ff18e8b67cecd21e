"""The mesh-wide pre-shared key in the lab: the same key talks, another does not.

Ranks 0 and 1 get one pre-shared key, rank 2 another. All three register
and configure each other as peers, so the only thing between rank 2 and the
others is the key: 0 and 1 must reach each other, and no pair with rank 2
may ever exchange a packet.
"""

from __future__ import annotations

import base64
import os

import trio
from bounds import form

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab


def write_psk(lab: Lab, name: str, fill: int) -> str:
    path = lab.workdir / name
    path.write_text(base64.b64encode(bytes([fill]) * 32).decode() + "\n")
    os.chmod(path, 0o600)
    return str(path)


async def test_only_ranks_with_the_same_preshared_key_talk(lab: Lab) -> None:
    with trio.fail_after(90):
        mesh = MeshLab.create(lab)
        shared, other = write_psk(lab, "psk-a", 7), write_psk(lab, "psk-b", 9)
        for rank, psk in ((0, shared), (1, shared), (2, other)):
            await mesh.start_rank(rank, "--preshared-key-file", psk)
        await mesh.start_probes()
        await form(mesh, {0, 1})
        # Every daemon has both others as peers: only the key stands in the way.
        with trio.fail_after(20):
            while await mesh.registered_ranks() != {0, 1, 2}:
                await trio.sleep(0.2)
        for rank in (0, 1, 2):
            peers = await mesh.device_peers(rank)
            assert len(peers) == 2, (rank, peers)
        await trio.sleep(6.0)  # > one handshake retry (5 s) with rank 2
        reached = mesh.first_reached()
        with_2 = [pair for pair in reached if 2 in pair]
        assert with_2 == [], f"rank 2 exchanged packets with another key: {with_2}"
        # wg show dump rows: public key, preshared key, endpoint, allowed IPs, handshake, ...
        shared_key = base64.b64encode(bytes([7]) * 32).decode()
        for row in await mesh.device_dump(0):
            assert row[1] == shared_key, "every peer of rank 0 uses the mesh key"
            if row[3] == f"{mesh.address(2)}/32":
                assert row[4] == "0", f"rank 0 shook hands with rank 2: {row[4]}"
        for rank in (0, 1, 2):
            log = mesh.daemons[rank].log_text()
            assert base64.b64encode(bytes([7]) * 32).decode() not in log
            assert base64.b64encode(bytes([9]) * 32).decode() not in log
