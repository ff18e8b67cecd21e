from __future__ import annotations

import tomllib

import pytest
from render_fixtures import DUAL, EXAMPLE, LAB, LAB6

from vnetd.render.flux import FluxOptions, render_flux, toml_value
from vnetd.spec import MeshSpec, load_spec

CASES = [
    pytest.param(LAB, FluxOptions(), "flux-lab.toml", id="ipv4-defaults"),
    pytest.param(
        LAB,
        FluxOptions(curve_cert="/run/flux/curve.cert", port=9050, bind="interface", fanout=2),
        "flux-lab-interface-fanout2.toml",
        id="ipv4-interface-fanout2",
    ),
    pytest.param(LAB6, FluxOptions(), "flux-lab6.toml", id="ipv6-defaults"),
    pytest.param(LAB6, FluxOptions(fanout=1), "flux-lab6-fanout1.toml", id="ipv6-chain"),
    pytest.param(
        LAB6,
        FluxOptions(bind="interface", fanout=3),
        "flux-lab6-interface-fanout3.toml",
        id="ipv6-interface",
    ),
    pytest.param(load_spec(EXAMPLE), FluxOptions(), "flux-example.toml", id="example-spec"),
    pytest.param(DUAL, FluxOptions(), "flux-ds.toml", id="dual-stack-primary"),
    pytest.param(DUAL, FluxOptions(family=4), "flux-ds.toml", id="dual-stack-family4"),
    pytest.param(DUAL, FluxOptions(family=6), "flux-ds-family6.toml", id="dual-stack-family6"),
    pytest.param(
        DUAL,
        FluxOptions(family=6, bind="interface", fanout=2),
        "flux-ds-family6-interface-fanout2.toml",
        id="dual-stack-family6-interface",
    ),
]


@pytest.mark.parametrize(("spec", "options", "name"), CASES)
def test_flux_matches_golden(spec: MeshSpec, options: FluxOptions, name: str, golden):
    golden(name, render_flux(spec, options))


@pytest.mark.parametrize(("spec", "options", "name"), CASES)
def test_flux_parses_back_with_every_field(spec: MeshSpec, options: FluxOptions, name: str):
    text = render_flux(spec, options)
    data = tomllib.loads(text)
    assert list(data) == ["bootstrap"]
    boot = data["bootstrap"]
    version = options.family or spec.network.version
    expected_keys = {"curve_cert", "default_port", "hosts"} | (
        {"enable_ipv6"} if version == 6 else set()
    )
    assert set(boot) == expected_keys
    assert boot.get("enable_ipv6", False) is (version == 6)
    assert boot["curve_cert"] == options.curve_cert
    assert boot["default_port"] == options.port
    assert len(boot["hosts"]) == spec.size
    for rank, entry in enumerate(boot["hosts"]):
        addr = spec.address_in(rank, version)
        uri_host = f"[{addr}]" if addr.version == 6 else str(addr)
        expected = {
            "host": spec.host(rank),
            "bind": f"tcp://{spec.interface if options.bind == 'interface' else uri_host}:{options.port}",
            "connect": f"tcp://{uri_host}:{options.port}",
        }
        if options.fanout is not None and rank > 0:
            expected["parent"] = spec.host((rank - 1) // options.fanout)
        assert entry == expected, f"rank {rank}"
        # Flux's rule: a broker's rank is the index of the first entry with its hostname.
        assert [e["host"] for e in boot["hosts"]].index(spec.host(rank)) == rank


def test_flux_layout_is_one_line_per_rank_and_no_date():
    text = render_flux(LAB6, FluxOptions(fanout=2))
    lines = text.splitlines()
    assert lines[0] == "# Flux bootstrap config rendered by vnetd from mesh lab6."
    assert (
        sum(line.startswith("  { host = ") and line.endswith(" },") for line in lines) == LAB6.size
    )
    assert lines[7] == (
        '  { host = "lab6-0", bind = "tcp://[fd00:250::1]:8050", connect = "tcp://[fd00:250::1]:8050" },'
    )
    assert lines[8].endswith('parent = "lab6-0" },')
    assert text.endswith("]\n")
    assert "20" not in lines[0]  # no year, no timestamp


@pytest.mark.parametrize(
    ("fanout", "parents"),
    [
        pytest.param(1, [None, 0, 1, 2, 3, 4, 5, 6], id="chain"),
        pytest.param(2, [None, 0, 0, 1, 1, 2, 2, 3], id="binary"),
        pytest.param(3, [None, 0, 0, 0, 1, 1, 1, 2], id="ternary"),
        pytest.param(8, [None, 0, 0, 0, 0, 0, 0, 0], id="flat"),
    ],
)
def test_fanout_is_flux_kary_numbering(fanout: int, parents: list[int | None]):
    spec = load_spec(EXAMPLE)
    hosts = tomllib.loads(render_flux(spec, FluxOptions(fanout=fanout)))["bootstrap"]["hosts"]
    assert [h.get("parent") for h in hosts] == [
        None if p is None else f"flux-sample-{p}" for p in parents
    ]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("/etc/flux/system/curve.cert", id="plain"),
        pytest.param('quote " and backslash \\', id="quote-backslash"),
        pytest.param("tab\tnewline\ncr\r", id="whitespace-controls"),
        pytest.param("nul\x00 bell\x07 esc\x1b del\x7f", id="other-controls"),
        pytest.param("é ü 漢字", id="bmp"),
        pytest.param("emoji \U0001f600", id="outside-bmp"),
        pytest.param("", id="empty"),
    ],
)
def test_toml_strings_round_trip(value: str):
    assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        pytest.param(True, "true", id="true"),
        pytest.param(False, "false", id="false"),
        pytest.param(8050, "8050", id="int"),
    ],
)
def test_toml_scalars(value: bool | int, literal: str):
    assert toml_value(value) == literal


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(FluxOptions(port=0), id="port-0"),
        pytest.param(FluxOptions(port=70000), id="port-70000"),
        pytest.param(FluxOptions(fanout=0), id="fanout-0"),
    ],
)
def test_flux_rejects_bad_options(options: FluxOptions):
    with pytest.raises(ValueError, match="out of range|less than 1"):
        render_flux(LAB, options)


@pytest.mark.parametrize(
    ("spec", "family"),
    [
        pytest.param(LAB, 6, id="ipv4-only-has-no-ipv6"),
        pytest.param(LAB6, 4, id="ipv6-only-has-no-ipv4"),
    ],
)
def test_flux_family_the_mesh_lacks_is_refused(spec: MeshSpec, family: int):
    with pytest.raises(ValueError, match=f"has no IPv{family} network"):
        render_flux(spec, FluxOptions(family=family))


def test_flux_family6_of_a_dual_stack_mesh_brackets_and_enables_ipv6():
    data = tomllib.loads(render_flux(DUAL, FluxOptions(family=6)))["bootstrap"]
    assert data["enable_ipv6"] is True
    assert data["hosts"][1] == {
        "host": "ds-1",
        "bind": "tcp://[fd00:250::2]:8050",
        "connect": "tcp://[fd00:250::2]:8050",
    }
    assert "enable_ipv6" not in tomllib.loads(render_flux(DUAL))["bootstrap"]
