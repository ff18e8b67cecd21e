"""Trust boundaries against a real etcd: what a writer of the registry cannot do.

Someone with write access overwrites a live member's entry in place (no
delete first) with another instance and another public key, and writes a
record for a free rank that names a foreign address. Every daemon keeps the
real member and its key, gives no peer an address other than its rank's,
and traffic between the real members keeps flowing.
"""

from __future__ import annotations

import base64
import json

import trio
from bounds import form

from vnetd.control.membership import encode_member, member_key
from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab
from vnetd.model import Member

FORGED_KEY = base64.b64encode(bytes(range(40, 72))).decode()


async def test_a_registry_writer_cannot_take_a_held_rank_or_an_address(lab: Lab) -> None:
    with trio.fail_after(90):
        mesh = MeshLab.create(lab)
        for rank in (0, 1):
            await mesh.start_rank(rank)
        await mesh.start_probes()
        await form(mesh, {0, 1})
        before = sorted(await mesh.device_dump(0))

        forged = Member(1, FORGED_KEY, "198.18.1.2:51820", "intruder", 1.0, "x")
        await lab.etcdctl("put", member_key(mesh.spec, 1), encode_member(forged).decode())
        other_key = base64.b64encode(bytes(range(80, 112))).decode()
        naming = json.loads(encode_member(Member(2, other_key, "198.18.1.2:51820", "pod2")))
        naming["allowed_ips"] = [f"{mesh.address(0)}/32"]
        await lab.etcdctl("put", member_key(mesh.spec, 2), json.dumps(naming))

        with trio.move_on_after(10):
            while "refusing a rewrite of rank 1's entry by intruder" not in (
                mesh.daemons[0].log_text()
            ):
                await trio.sleep(0.1)
        log0 = mesh.daemons[0].log_text()
        assert "refusing a rewrite of rank 1's entry by intruder" in log0, log0[-1500:]
        await trio.sleep(2.0)  # room for any (wrong) plan to be applied
        after = await mesh.device_dump(0)
        rows = [[row[0], row[2], row[3]] for row in after]
        assert rows == [[row[0], row[2], row[3]] for row in before], (before, after)
        assert all(row[0] != FORGED_KEY for row in after)
        assert [row[3] for row in after] == [f"{mesh.address(1)}/32"]
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        for rank in (0, 1):
            assert mesh.daemons[rank].returncode is None, mesh.daemons[rank].log_text()
