"""``mtu = "auto"``: parsing, what the mesh compares, the overhead rule, wg-quick's output."""

from __future__ import annotations

from typing import Any

import pytest

from vnetd.dataplane.rtnetlink.link_reads import auto_mtu
from vnetd.errors import SpecError
from vnetd.render.wgquick import render_wg_quick
from vnetd.spec import parse_spec


def spec(mtu: object, network: str = "10.250.0.0/16") -> Any:  # noqa: ANN401
    return parse_spec({"mesh": {"name": "m", "size": 2, "network": network, "mtu": mtu}})


def test_auto_is_kept_as_auto_and_compared_as_such() -> None:
    auto = spec("auto")
    assert auto.mtu == "auto"
    assert b'"mtu":"auto"' in auto.canonical_json()
    assert auto.differing_keys(spec(1420).canonical_json()) == ["mtu"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("1420", 'mesh.mtu: expected an integer or "auto", got a string', id="str"),
        pytest.param(True, 'mesh.mtu: expected an integer or "auto", got a boolean', id="bool"),
        pytest.param(500, r"mesh.mtu: 500 is out of range \(576..65535\)", id="low"),
    ],
)
def test_bad_mtu(value: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec(value)


@pytest.mark.parametrize(
    ("underlay", "host", "mtu"),
    [
        pytest.param(1500, "198.18.1.0", 1440, id="ipv4"),
        pytest.param(1500, "fd00:198:18::1", 1420, id="ipv6"),
        pytest.param(1400, "198.18.1.0", 1340, id="ipv4-1400"),
        pytest.param(9001, "10.0.0.5", 8941, id="jumbo"),
    ],
)
def test_overhead_follows_the_endpoint_family(underlay: int, host: str, mtu: int) -> None:
    assert auto_mtu(underlay, host) == mtu


def test_wg_quick_leaves_mtu_to_wg_quick_when_auto() -> None:
    text = render_wg_quick(spec("auto"), 0, {}, None)
    assert "MTU" not in text
    assert "MTU = 1380" in render_wg_quick(spec(1380), 0, {}, None)
