"""``[mesh] network6``: the dual-stack spec rules, the address plan and the registry form."""

from __future__ import annotations

import copy
import json
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from vnetd.cli import main
from vnetd.errors import SpecError
from vnetd.mesh.peers import desired_peers, diff
from vnetd.model import DevicePeer, Member
from vnetd.spec import parse_spec

DUAL = {
    "mesh": {
        "name": "ds",
        "size": 4,
        "network": "10.250.0.0/24",
        "network6": "fd00:250::/64",
        "hostname": "ds-{rank}",
    }
}


def dual(**changes: object) -> dict:
    data = copy.deepcopy(DUAL)
    for key, value in changes.items():
        if value is None:
            del data["mesh"][key]
        else:
            data["mesh"][key] = value
    return data


def test_address_plan_has_both_families_primary_first():
    spec = parse_spec(DUAL)
    assert spec.network6 == ip_network("fd00:250::/64")
    assert spec.addresses(2) == (ip_address("10.250.0.3"), ip_address("fd00:250::3"))
    assert spec.address(2) == ip_address("10.250.0.3"), "address() stays the primary"
    assert [str(a) for a in spec.interface_addresses(2)] == ["10.250.0.3/24", "fd00:250::3/64"]
    assert str(spec.interface_address(2)) == "10.250.0.3/24"
    assert str(spec.interface_address6(2)) == "fd00:250::3/64"
    assert spec.allowed_ips(2) == ("10.250.0.3/32", "fd00:250::3/128")
    assert spec.versions == (4, 6)
    assert (spec.address_in(2, 4), spec.address_in(2, 6)) == spec.addresses(2)


def test_the_offset_applies_to_both_networks():
    spec = parse_spec(dual(offset=10))
    assert [str(a) for a in spec.addresses(0)] == ["10.250.0.10", "fd00:250::a"]


@pytest.mark.parametrize(
    ("network", "versions", "allowed"),
    [
        pytest.param("10.250.0.0/24", (4,), ("10.250.0.2/32",), id="ipv4-only"),
        pytest.param("fd00:250::/64", (6,), ("fd00:250::2/128",), id="ipv6-only"),
    ],
)
def test_single_stack_specs_are_unchanged(network, versions, allowed):
    spec = parse_spec(dual(network=network, network6=None))
    assert spec.network6 is None and spec.interface_address6(1) is None
    assert spec.versions == versions
    assert spec.addresses(1) == (spec.address(1),)
    assert spec.allowed_ips(1) == allowed
    with pytest.raises(ValueError, match="has no IPv"):
        spec.address_in(1, 10 - versions[0])


def test_allowed_ips_are_sorted_as_the_devices_report_them():
    """A v4 address that sorts after the v6 one as text: the device lists them sorted."""
    spec = parse_spec(dual(network="30.0.0.0/24", network6="2001:db8::/64"))
    assert spec.allowed_ips(0) == ("2001:db8::1/128", "30.0.0.1/32")
    assert spec.addresses(0)[0] == ip_address("30.0.0.1"), "addresses keep the primary first"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"network": "fd00:1::/64"},
            r"^mesh\.network6: set, but mesh\.network 'fd00:1::/64' is IPv6 too; for dual stack "
            r"make mesh\.network IPv4, for IPv6 alone leave mesh\.network6 out$",
            id="both-ipv6",
        ),
        pytest.param(
            {"network6": "10.251.0.0/24"},
            r"^mesh\.network6: '10\.251\.0\.0/24' is not an IPv6 network; give an IPv6 CIDR "
            r"such as \"fd00:250::/64\" \(the IPv4 network goes in mesh\.network\)$",
            id="network6-ipv4",
        ),
        pytest.param(
            {"network6": "fd00:250::1/64"},
            r"^mesh\.network6: 'fd00:250::1/64' is not a network in CIDR form: .*host bits set$",
            id="host-bits",
        ),
        pytest.param(
            {"network6": "fd00:250::/129"},
            r"^mesh\.network6: 'fd00:250::/129' is not a network in CIDR form",
            id="bad-cidr",
        ),
        pytest.param(
            {"network6": 64},
            r"^mesh\.network6: expected a string, got an integer$",
            id="wrong-type",
        ),
        pytest.param(
            {"network6": "fd00:250::/126"},
            r"^mesh\.size: 4 ranks do not fit in mesh\.network6 fd00:250::/126 with offset 1 "
            r"\(room for 3\); use a larger network or a smaller size$",
            id="size-fits-network6",
        ),
        pytest.param(
            {"network": "10.250.0.0/29", "size": 7},
            r"^mesh\.size: 7 ranks do not fit in 10\.250\.0\.0/29 with offset 1 \(room for 6\)",
            id="size-fits-network",
        ),
        pytest.param(
            {"mtu": 1279},
            r"^mesh\.mtu: 1279 is out of range \(1280\.\.65535\)$",
            id="ipv6-minimum-mtu",
        ),
    ],
)
def test_bad_dual_stack_specs_name_the_key(changes, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(dual(**changes))


def test_ipv4_only_keeps_its_minimum_mtu():
    assert parse_spec(dual(network6=None, mtu=576)).mtu == 576
    assert parse_spec(dual(mtu=1280)).mtu == 1280


def test_registry_form_leaves_network6_out_when_absent():
    """Meshes created before network6 existed compare equal; dual stack differs from them."""
    single = parse_spec(dual(network6=None))
    assert "network6" not in json.loads(single.canonical_json())
    stored_by_an_older_version = json.dumps(
        {"hostname": "ds-{rank}", "interface": "vnet0", "mtu": 1420, "name": "ds",
         "network": "10.250.0.0/24", "offset": 1, "persistent_keepalive": 0, "port": 51820,
         "size": 4}, sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip
    assert single.canonical_json() == stored_by_an_older_version
    assert single.differing_keys(stored_by_an_older_version) == []
    dual_stack = parse_spec(DUAL)
    assert json.loads(dual_stack.canonical_json())["network6"] == "fd00:250::/64"
    assert dual_stack.differing_keys(single.canonical_json()) == ["network6"]
    assert single.differing_keys(dual_stack.canonical_json()) == ["network6"]
    other6 = parse_spec(dual(network6="fd00:251::/64"))
    assert other6.differing_keys(dual_stack.canonical_json()) == ["network6"]


def member(rank: int) -> Member:
    return Member(rank, f"{rank:02d}".ljust(43, "A") + "=", f"198.18.1.{rank}:51820", f"p{rank}")


def test_desired_peers_carry_both_host_routes_and_a_device_reporting_them_is_in_sync():
    spec = parse_spec(DUAL)
    members = {rank: member(rank) for rank in range(3)}
    peers, skipped = desired_peers(members, 0, spec)
    assert skipped == []
    assert {p.rank: p.allowed_ips for p in peers.values()} == {
        1: ("10.250.0.2/32", "fd00:250::2/128"),
        2: ("10.250.0.3/32", "fd00:250::3/128"),
    }
    # The device reports them sorted (uapi_protocol.parse_peers): no update is planned.
    device = {
        key: DevicePeer(key, tuple(sorted(p.allowed_ips)), p.endpoint) for key, p in peers.items()
    }
    written = {key: p.endpoint for key, p in peers.items()}
    assert not diff(peers, device, written)
    # A device left with the IPv4 route alone (an older vnetd) gets the IPv6 one added.
    only4 = {key: DevicePeer(key, p.allowed_ips[:1], p.endpoint) for key, p in peers.items()}
    plan = diff(peers, only4, written)
    assert [(u.allowed_ips, u.old_allowed_ips) for u in plan.update] == [
        (("10.250.0.2/32", "fd00:250::2/128"), ("10.250.0.2/32",)),
        (("10.250.0.3/32", "fd00:250::3/128"), ("10.250.0.3/32",)),
    ]
    assert not plan.add and not plan.remove


def test_plan_prints_the_ipv6_address_as_a_fourth_column(tmp_path: Path, capsys):
    path = tmp_path / "ds.toml"
    path.write_text(
        '[mesh]\nname = "ds"\nsize = 2\nnetwork = "10.250.0.0/24"\n'
        'network6 = "fd00:250::/64"\nhostname = "ds-{rank}"\n'
    )
    assert main(["plan", "--config", str(path)]) == 0
    assert capsys.readouterr().out == (
        "# mesh ds: 2 ranks in 10.250.0.0/24 and fd00:250::/64, port 51820\n"
        "# rank, address, hostname, IPv6 address\n"
        "0\t10.250.0.1\tds-0\tfd00:250::1\n"
        "1\t10.250.0.2\tds-1\tfd00:250::2\n"
    )


def test_plan_of_a_single_stack_mesh_has_three_columns(tmp_path: Path, capsys):
    path = tmp_path / "one.toml"
    path.write_text('[mesh]\nname = "one"\nsize = 1\nnetwork = "10.250.0.0/24"\n')
    assert main(["plan", "--config", str(path)]) == 0
    assert capsys.readouterr().out == (
        "# mesh one: 1 ranks in 10.250.0.0/24, port 51820\n0\t10.250.0.1\tone-0\n"
    )
