"""Sites: the endpoint each daemon uses for a peer, cross-site keepalive, and the
member record's optional ``site`` and ``public_endpoint`` (docs/architecture.md, "Sites")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from shared import byte_key as key

from vnetd.control.membership import BadEntry, decode_member, encode_member, member_key
from vnetd.dataplane.base import handshake_keepalives
from vnetd.dataplane.codec.uapi_protocol import plan_lines
from vnetd.dataplane.kernel.device import handshake_messages, peer_messages
from vnetd.dataplane.wireguard_go.device import handshake_lines
from vnetd.errors import IdentityError, SpecError
from vnetd.identity import resolve_public_endpoint, resolve_site
from vnetd.mesh.peers import desired_peers, diff, peer_endpoint, written_after
from vnetd.model import Member, Plan
from vnetd.spec import SiteSpec, parse_spec

MESH = {"name": "m", "size": 8, "network": "10.250.0.0/16"}
SPEC = parse_spec({"mesh": MESH})


def member(rank: int, site: str = "default", public: str | None = None) -> Member:
    return Member(rank, key(rank + 1), f"10.0.{rank}.1:51820", f"pod-{rank}", 1.0, "v", "",
                  site, public)  # fmt: skip


@pytest.mark.parametrize(
    ("my_site", "peer_site", "public", "want"),
    [
        ("default", "default", None, "10.0.3.1:51820"),  # one site: as before
        ("default", "default", "203.0.113.9:4000", "10.0.3.1:51820"),  # same site: site endpoint
        ("a", "a", "203.0.113.9:4000", "10.0.3.1:51820"),
        ("a", "b", "203.0.113.9:4000", "203.0.113.9:4000"),  # across sites: the public one
        ("a", "b", None, None),  # none: it reaches us, and WireGuard roams
        ("default", "b", None, None),
    ],
)
def test_endpoint_choice(my_site: str, peer_site: str, public: str | None, want: str | None):
    assert peer_endpoint(member(3, peer_site, public), my_site) == want


@pytest.mark.parametrize(
    ("mesh", "peer_site", "want"),
    [
        ({}, "a", None),  # same site: the device's keepalive
        ({}, "b", 25),  # across sites: the default site_keepalive
        ({"site_keepalive": 7}, "b", 7),
        ({"site_keepalive": 0}, "b", None),  # off
    ],
)
def test_cross_site_keepalive(mesh: dict[str, int], peer_site: str, want: int | None):
    spec = replace(parse_spec({"mesh": {**MESH, **mesh}}), site=SiteSpec("a"))
    peers, _ = desired_peers({3: member(3, peer_site, "203.0.113.9:4000")}, 0, spec)
    assert peers[key(4)].keepalive == want


def test_single_site_mesh_unchanged():
    """No site anywhere: endpoints are the registered ones and no keepalive is set."""
    members = {r: member(r) for r in range(4)}
    peers, skipped = desired_peers(members, 0, SPEC)
    assert not skipped
    assert {p.rank: (p.endpoint, p.keepalive) for p in peers.values()} == {
        r: (f"10.0.{r}.1:51820", None) for r in (1, 2, 3)
    }


def test_roamed_endpoint_not_rewritten_across_sites():
    """Invariant 4: the chosen (public) endpoint is what is compared with ``written``."""
    spec = replace(SPEC, site=SiteSpec("a"))
    members = {1: member(1, "b", "203.0.113.9:4000")}
    desired, _ = desired_peers(members, 0, spec)
    written = written_after(desired)
    roamed = {k: replace(p, endpoint="198.51.100.7:61000") for k, p in desired.items()}
    assert not diff(desired, roamed, written)
    moved = {1: member(1, "b", "203.0.113.9:4001")}
    desired, _ = desired_peers(moved, 0, spec)
    plan = diff(desired, roamed, written)
    assert [u.endpoint for u in plan.update] == ["203.0.113.9:4001"]


def test_old_record_reads_as_default_site():
    old = {"rank": 2, "public_key": key(3), "endpoint": "10.0.2.1:51820", "instance": "p",
           "started": 1.0, "version": "0.1.0", "device_id": ""}  # fmt: skip
    got = decode_member(SPEC, member_key(SPEC, 2), json.dumps(old).encode())
    assert (got.site, got.public_endpoint) == ("default", None)


@pytest.mark.parametrize(
    ("site", "public", "fields"),
    [
        ("default", None, set()),  # written as before: an older vnetd sees the same record
        ("b", None, {"site"}),
        ("default", "203.0.113.9:4000", {"public_endpoint"}),
        ("b", "[2001:db8::1]:4000", {"site", "public_endpoint"}),
    ],
)
def test_record_round_trip(site: str, public: str | None, fields: set[str]):
    me = member(2, site, public)
    encoded = encode_member(me)
    base = {"rank", "public_key", "endpoint", "instance", "started", "version", "device_id"}
    assert set(json.loads(encoded)) == base | fields
    assert decode_member(SPEC, member_key(SPEC, 2), encoded) == me


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("site", 3, "field site is not a string"),
        ("site", "Site B", "field site: 'Site B' is not a site name"),
        ("public_endpoint", "nowhere", "field public_endpoint: 'nowhere' is not HOST:PORT"),
        ("public_endpoint", 4000, "field public_endpoint is not a string"),
    ],
)
def test_bad_site_fields_refused(field: str, value: object, message: str):
    record = json.loads(encode_member(member(2)))
    record[field] = value
    with pytest.raises(BadEntry, match=message):
        decode_member(SPEC, member_key(SPEC, 2), json.dumps(record).encode())


def test_spec_site_table_is_local_and_keepalive_key_optional():
    plain = parse_spec({"mesh": MESH})
    sited = parse_spec({"mesh": MESH, "site": {"name": "b", "public_endpoint": "1.2.3.4:5"}})
    assert sited.site == SiteSpec("b", "1.2.3.4:5")
    assert plain.canonical_json() == sited.canonical_json()  # [site] is not compared
    assert "site_keepalive" not in plain.mesh_table()
    assert parse_spec({"mesh": {**MESH, "site_keepalive": 10}}).mesh_table()["site_keepalive"] == 10
    with pytest.raises(SpecError, match="site.name: 'B!' is not a site name"):
        parse_spec({"mesh": MESH, "site": {"name": "B!"}})
    with pytest.raises(SpecError, match="site.colour: unknown key"):
        parse_spec({"mesh": MESH, "site": {"colour": "x"}})


@pytest.mark.parametrize(
    ("flag", "env", "table", "want"),
    [
        (None, {}, "default", "default"),
        (None, {}, "a", "a"),
        (None, {"VNETD_SITE": "b"}, "a", "b"),
        ("c", {"VNETD_SITE": "b"}, "a", "c"),
    ],
)
def test_site_order(flag: str | None, env: dict[str, str], table: str, want: str):
    spec = replace(SPEC, site=SiteSpec(table))
    assert resolve_site(spec, flag, env) == want


def test_site_and_public_endpoint_errors_name_the_source():
    with pytest.raises(SpecError, match="VNETD_SITE: 'B B' is not a site name"):
        resolve_site(SPEC, None, {"VNETD_SITE": "B B"})
    with pytest.raises(IdentityError, match="--public-endpoint: 'x' is not HOST:PORT"):
        resolve_public_endpoint(SPEC, "x", {})
    env = {"VNETD_PUBLIC_ENDPOINT": "203.0.113.1:9"}
    assert resolve_public_endpoint(SPEC, None, env) == "203.0.113.1:9"
    assert resolve_public_endpoint(SPEC, None, {}) is None


def test_data_planes_set_the_peer_keepalive_also_after_a_handshake():
    spec = replace(SPEC, site=SiteSpec("a"))
    peers, _ = desired_peers({1: member(1, "b", "203.0.113.9:4000"), 2: member(2, "a")}, 0, spec)
    plan = Plan(add=tuple(sorted(peers.values())), handshake=(key(2), key(3)))
    ending = handshake_keepalives(plan, 0)
    lines = plan_lines(plan, 0) + handshake_lines(plan.handshake, 0, ending)
    # Every added peer writes its keepalive, 0 too (wireguard-go's carry-over, invariant 10);
    # one whose handshake the plan starts is added with it off, and the handshake's steps,
    # sent once the routes are in, end at its 25.
    assert [v for k, v in lines if k == "persistent_keepalive_interval"] == [
        "0", "0", "0", "1", "25", "0", "1", "0",
    ]  # fmt: skip
    msgs = peer_messages(plan, 0) + handshake_messages(plan.handshake, 0, ending)
    assert [m.get("persistent_keepalive") for m in msgs] == [None, None, 0, 1, 25, 0, 1, 0]


def test_wg_quick_for_a_host_in_another_site_uses_public_endpoints():
    from vnetd.render.wgquick import render_wg_quick

    spec = replace(SPEC, site=SiteSpec("a"))
    members = {1: member(1, "b", "203.0.113.9:4000"), 2: member(2, "a")}
    text = render_wg_quick(spec, 0, members, None)
    peers = text.split("[Peer]")[1:]
    assert "Endpoint = 203.0.113.9:4000\nPersistentKeepalive = 25" in peers[0]
    assert "Endpoint = 10.0.2.1:51820" in peers[1] and "PersistentKeepalive" not in peers[1]
