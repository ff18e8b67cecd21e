from __future__ import annotations

import copy
from ipaddress import ip_address
from pathlib import Path

import pytest

from vnetd.errors import SpecError
from vnetd.spec import load_spec, parse_spec

BASE = {
    "mesh": {
        "name": "flux-sample",
        "size": 8,
        "network": "10.250.0.0/16",
        "port": 51820,
        "interface": "vnet0",
        "mtu": 1420,
        "hostname": "flux-sample-{rank}",
    },
    "registry": {"endpoints": ["http://127.0.0.1:2379"], "prefix": "/vnetd", "lease_ttl": 10},
}


def with_(table: str, key: str, value: object) -> dict:
    data = copy.deepcopy(BASE)
    if value is _DELETE:
        del data[table][key]
    else:
        data[table][key] = value
    return data


_DELETE = object()


def test_example_spec_loads():
    spec = load_spec(Path(__file__).parents[2] / "examples" / "mesh.toml")
    assert spec.name == "flux-sample"
    assert spec.size == 8
    assert spec.address(0) == ip_address("10.250.0.1")


@pytest.mark.parametrize(
    ("rank", "address", "host"),
    [
        pytest.param(0, "10.250.0.1", "flux-sample-0", id="rank0-is-host-1"),
        pytest.param(7, "10.250.0.8", "flux-sample-7", id="last-rank"),
    ],
)
def test_address_plan(rank, address, host):
    spec = parse_spec(BASE)
    assert str(spec.address(rank)) == address
    assert spec.host(rank) == host
    assert spec.allowed_ips(rank) == (f"{address}/32",)
    assert str(spec.interface_address(rank)) == f"{address}/16"


def test_address_plan_crosses_octets():
    spec = parse_spec(with_("mesh", "size", 1000))
    assert str(spec.address(255)) == "10.250.1.0"
    assert str(spec.address(999)) == "10.250.3.232"


def test_ipv6_network():
    spec = parse_spec(with_("mesh", "network", "fd00:250::/64"))
    assert str(spec.address(0)) == "fd00:250::1"
    assert spec.allowed_ips(0) == ("fd00:250::1/128",)


def test_offset_moves_every_address():
    spec = parse_spec(with_("mesh", "offset", 10))
    assert str(spec.address(0)) == "10.250.0.10"


@pytest.mark.parametrize(
    ("hostname", "expected"),
    [
        pytest.param("flux-sample-3", 3, id="exact"),
        pytest.param("flux-sample-3.flux-sample.default.svc.cluster.local", 3, id="fqdn"),
        pytest.param("flux-sample-03", None, id="leading-zero"),
        pytest.param("flux-sample-8", None, id="out-of-range"),
        pytest.param("other-3", None, id="other-pattern"),
    ],
)
def test_rank_of_host(hostname, expected):
    assert parse_spec(BASE).rank_of_host(hostname) == expected


def test_rank_out_of_range_is_refused():
    with pytest.raises(SpecError, match="rank 8 is out of range"):
        parse_spec(BASE).address(8)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            with_("mesh", "size", 70000), r"mesh\.size: 70000 ranks do not fit", id="too-big"
        ),
        pytest.param(
            {"mesh": {**BASE["mesh"], "network": "10.250.0.0/30", "size": 3}},
            r"mesh\.size: 3 ranks do not fit in 10\.250\.0\.0/30",
            id="broadcast-kept-free",
        ),
        pytest.param(
            with_("mesh", "network", "10.250.0.0/33"),
            r"mesh\.network: .* not a network",
            id="bad-cidr",
        ),
        pytest.param(
            with_("mesh", "network", "10.250.0.1/16"), r"mesh\.network: .*host bits", id="host-bits"
        ),
        pytest.param(with_("mesh", "port", 0), r"mesh\.port: 0 is out of range", id="port-low"),
        pytest.param(
            with_("mesh", "port", 70000), r"mesh\.port: 70000 is out of range", id="port-high"
        ),
        pytest.param(
            with_("mesh", "hostname", "node"), r"mesh\.hostname: .*no '\{rank\}'", id="no-rank"
        ),
        pytest.param(
            with_("mesh", "hostname", "n-{rank}-{x}"),
            r"mesh\.hostname: .*placeholders",
            id="bad-placeholder",
        ),
        pytest.param(
            with_("mesh", "colour", "red"), r"mesh\.colour: unknown key", id="unknown-key"
        ),
        pytest.param({**BASE, "extra": {}}, r"unknown table or key 'extra'", id="unknown-table"),
        pytest.param(
            with_("mesh", "size", "8"),
            r"mesh\.size: expected an integer, got a string",
            id="wrong-type",
        ),
        pytest.param(
            with_("mesh", "size", True),
            r"mesh\.size: expected an integer, got a boolean",
            id="bool-not-int",
        ),
        pytest.param(with_("mesh", "size", 0), r"mesh\.size: 0 is out of range", id="size-zero"),
        pytest.param(
            with_("mesh", "name", "Flux_Sample"), r"mesh\.name: .*DNS label", id="bad-name"
        ),
        pytest.param(with_("mesh", "name", _DELETE), r"mesh\.name: missing", id="missing-name"),
        pytest.param(
            with_("mesh", "interface", "a-very-long-ifname0"), r"mesh\.interface", id="long-ifname"
        ),
        pytest.param(with_("mesh", "mtu", 100), r"mesh\.mtu: 100 is out of range", id="mtu-low"),
        pytest.param(
            with_("registry", "endpoints", []), r"registry\.endpoints: empty", id="no-endpoints"
        ),
        pytest.param(
            with_("registry", "endpoints", ["127.0.0.1:2379"]),
            r"registry\.endpoints: .*not an etcd URL",
            id="url-no-scheme",
        ),
        pytest.param(
            with_("registry", "prefix", "vnetd"), r"registry\.prefix", id="relative-prefix"
        ),
        pytest.param(
            with_("registry", "lease_ttl", 1),
            r"registry\.lease_ttl: 1 is out of range",
            id="ttl-low",
        ),
        pytest.param(
            with_("registry", "watch", "http"),
            r"registry\.watch: 'http' is not one of json, grpc",
            id="watch-unknown",
        ),
        pytest.param(
            with_("registry", "watch_endpoints", ["10.0.0.1:23790"]),
            r"registry\.watch_endpoints: .*not an etcd URL",
            id="watch-endpoint-no-scheme",
        ),
        pytest.param({"mesh": "x"}, r"mesh: expected a table", id="mesh-not-table"),
    ],
)
def test_bad_spec_names_the_key(data, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_bad_toml_names_the_file(tmp_path):
    path = tmp_path / "mesh.toml"
    path.write_text("[mesh\nname=1")
    with pytest.raises(SpecError, match=r"mesh\.toml: not valid TOML"):
        load_spec(path)


def test_file_errors_carry_the_path(tmp_path):
    path = tmp_path / "mesh.toml"
    path.write_text('[mesh]\nname = "x"\nsize = 2\nnetwork = "10.0.0.0/8"\nport = -1\n')
    with pytest.raises(SpecError, match=r"^.*mesh\.toml: mesh\.port: -1 is out of range"):
        load_spec(path)


def test_canonical_json_ignores_registry_and_compares_keys():
    spec = parse_spec(BASE)
    other = parse_spec(with_("registry", "endpoints", ["http://10.0.0.1:2379"]))
    assert spec.canonical_json() == other.canonical_json()
    bigger = parse_spec(with_("mesh", "size", 16))
    assert spec.differing_keys(bigger.canonical_json()) == ["size"]
    assert spec.differing_keys(spec.canonical_json()) == []
    assert spec.differing_keys(b"not json") == ["<unparseable>"]
