"""Trust boundaries against a real etcd: what a writer of the registry cannot do.

Someone with write access overwrites a live member's entry in place (no
delete first) with another instance and another public key, and writes a
record for a free rank that names a foreign address. Every daemon keeps the
real member and its key, gives no peer an address other than its rank's,
and traffic between the real members keeps flowing. An endpoint no peer can be
reached at (loopback, link-local and the metadata service, multicast, an overlay
address) is refused with its record (docs/security.md, "Trust boundaries").
"""

from __future__ import annotations

import base64
import json

import trio
from test_rank_holder import grant_lease, two_ranks

from vnetd.control.membership import encode_member, member_key
from vnetd.lab.open_lab import Lab
from vnetd.model import Member

FORGED_KEY = base64.b64encode(bytes(range(40, 72))).decode()


async def test_a_registry_writer_cannot_take_a_held_rank_or_an_address(lab: Lab) -> None:
    with trio.fail_after(90):
        mesh = await two_ranks(lab)
        before = sorted(await mesh.device_dump(0))

        forged = Member(1, FORGED_KEY, "198.18.1.2:51820", "intruder", 1.0, "x")
        lease = await grant_lease(lab, 600)  # leaseless, it would be no member at all
        await lab.etcdctl("put", "--lease", lease, member_key(mesh.spec, 1),
                          encode_member(forged).decode())  # fmt: skip
        other_key = base64.b64encode(bytes(range(80, 112))).decode()
        naming = json.loads(encode_member(Member(2, other_key, "198.18.1.2:51820", "pod2")))
        naming["allowed_ips"] = [f"{mesh.address(0)}/32"]
        await lab.etcdctl("put", "--lease", lease, member_key(mesh.spec, 2), json.dumps(naming))

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


UNREACHABLE_ENDPOINTS = [
    ("127.0.0.1:51820", "a loopback address cannot be a peer's endpoint"),
    ("169.254.169.254:80", "a link-local address cannot be a peer's endpoint"),
    ("224.0.0.251:5353", "a multicast address cannot be a peer's endpoint"),
    ("[::ffff:127.0.0.1]:51820", "a loopback address cannot be a peer's endpoint"),
    ("10.250.0.2:51820", "is inside the overlay network 10.250.0.0/16"),
]


async def test_an_endpoint_no_peer_can_be_reached_at_never_reaches_a_device(lab: Lab) -> None:
    """Issue 25, item 8: a writer registers free rank 2 with an endpoint on the peers'
    own loopback, the cloud metadata service, a multicast group, an IPv4-mapped
    loopback and an overlay address (rank 1's), each under a key of its own. Every one
    is refused by rank 0 as a bad entry naming the field, and its key never reaches
    rank 0's device; then a record with a real underlay endpoint is taken (the check
    sees what it would see if the filter let one through)."""
    with trio.fail_after(90):
        mesh = await two_ranks(lab)
        key2 = member_key(mesh.spec, 2)
        lease = await grant_lease(lab, 600)  # leaseless, each would be skipped for that
        for n, (endpoint, why) in enumerate(UNREACHABLE_ENDPOINTS):
            key = base64.b64encode(bytes([120 + n]) * 32).decode()
            record = encode_member(Member(2, key, endpoint, f"intruder-{n}", 1.0, "x"))
            await lab.etcdctl("put", "--lease", lease, key2, record.decode())
            line = f"skipping bad registry entry: {key2}: field endpoint: "
            with trio.fail_after(10):
                while not any(line in text and why in text
                              for text in mesh.daemons[0].log_text().splitlines()):  # fmt: skip
                    await trio.sleep(0.1)
            assert key not in await mesh.device_peers(0), endpoint
        await trio.sleep(1.0)  # room for any (wrong) plan to be applied
        assert sorted(await mesh.device_ranks(0)) == [1]
        good = base64.b64encode(bytes([200]) * 32).decode()
        record = encode_member(
            Member(2, good, f"{mesh.pod(2).underlay_ip}:51820", "pod2", 1.0, "x")
        )
        await lab.etcdctl("put", "--lease", lease, key2, record.decode())
        with trio.fail_after(10):
            while good not in await mesh.device_peers(0):
                await trio.sleep(0.1)
        assert mesh.dead_daemons() == {}
