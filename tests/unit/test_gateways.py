"""Site gateways: which peer holds which ranks' addresses (docs/architecture.md, "Sites").

Site a (ranks 0-3) is public; site b (ranks 4-7) is behind NAT with gateways 4
and 5, the only members of b with a public endpoint.
"""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from vnetd.errors import SpecError
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member, Peer
from vnetd.spec import SiteSpec, parse_spec

MESH = {"name": "m", "size": 8, "network": "10.250.0.0/16"}
SPEC = parse_spec({"mesh": MESH, "sites": {"b": {"gateways": [5, 4]}}})


def member(rank: int) -> Member:
    site = "a" if rank < 4 else "b"
    public = f"198.18.0.{1 if site == 'a' else 2}:{40000 + rank}" if rank < 6 else None
    key = base64.b64encode(bytes([rank + 1]) * 32).decode()
    return Member(rank, key, f"10.{site == 'b' and 2 or 1}.0.{rank}:51820", f"p{rank}", 1.0,
                  "v", "", site, public)  # fmt: skip


def held(peers: dict[str, Peer]) -> dict[int | None, list[int]]:
    """Peer rank -> the ranks whose addresses it holds."""
    return {p.rank: sorted(int(ip.split(".")[3].split("/")[0]) - 1 for ip in p.allowed_ips)
            for p in peers.values()}  # fmt: skip


@pytest.mark.parametrize(
    ("me", "present", "want"),
    [
        # A public member: b's gateways direct, b's other members through the active one.
        (0, range(8), {1: [1], 2: [2], 3: [3], 4: [4, 6, 7], 5: [5]}),
        # A member behind b's gateways: its own site direct, every other site through 4.
        (6, range(8), {4: [0, 1, 2, 3, 4], 5: [5], 7: [7]}),
        # A gateway: everyone direct (site a has no gateways).
        (4, range(8), {r: [r] for r in (0, 1, 2, 3, 5, 6, 7)}),
        # Gateway 4 gone: 5 takes over, on both sides.
        (0, [0, 1, 5, 6, 7], {1: [1], 5: [5, 6, 7]}),
        (6, [0, 1, 5, 6, 7], {5: [0, 1, 5], 7: [7]}),
        # No gateway of b present: b's members are absent from a, and a from them.
        (0, [0, 1, 6, 7], {1: [1]}),
        (6, [0, 1, 6, 7], {7: [7]}),
    ],
)
def test_who_holds_which_addresses(me: int, present: range | list[int], want: dict):
    spec = replace(SPEC, site=SiteSpec("a" if me < 4 else "b"))
    peers, skipped = desired_peers({r: member(r) for r in present}, me, spec)
    assert not skipped
    assert held(peers) == want
    addresses = [ip for p in peers.values() for ip in p.allowed_ips]
    assert len(addresses) == len(set(addresses))  # invariant 2


def test_gateway_peer_carries_the_public_endpoint_and_keepalive():
    spec = replace(SPEC, site=SiteSpec("a"))
    peers, _ = desired_peers({r: member(r) for r in range(8)}, 0, spec)
    gateway = next(p for p in peers.values() if p.rank == 4)
    assert (gateway.endpoint, gateway.keepalive) == ("198.18.0.2:40004", 25)


def test_no_gateways_changes_nothing():
    plain = parse_spec({"mesh": MESH})
    members = {r: member(r) for r in range(8)}
    peers, _ = desired_peers(members, 6, replace(plain, site=SiteSpec("b")))
    assert held(peers) == {r: [r] for r in (0, 1, 2, 3, 4, 5, 7)}
    assert "gateways" not in plain.mesh_table()
    assert SPEC.mesh_table()["gateways"] == {"b": [4, 5]}


@pytest.mark.parametrize(
    ("sites", "message"),
    [
        ({"b": {"gateways": []}}, "sites.b.gateways: empty"),
        ({"b": {"gateways": [8]}}, "sites.b.gateways: 8 is not a rank in 0..7"),
        ({"b": {"gateways": [4]}, "c": {"gateways": [4]}}, "rank 4 is already a gateway of site b"),
        ({"B": {"gateways": [4]}}, "sites.B: 'B' is not a site name"),
        ({"b": {"via": [4]}}, "sites.b.via: unknown key"),
    ],
)
def test_bad_gateway_tables_are_named(sites: dict, message: str):
    with pytest.raises(SpecError, match=message):
        parse_spec({"mesh": MESH, "sites": sites})
