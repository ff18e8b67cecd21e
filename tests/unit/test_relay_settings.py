"""Where a daemon's relays come from (``vnetd.config``): ``--relay``, then
``VNETD_RELAYS``, then ``[registry] relays``; a bad URL names its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnetd.cli import build_parser
from vnetd.config import spec_from_args
from vnetd.errors import SpecError

SPEC = """[mesh]
name = "m"
size = 4
network = "10.250.0.0/16"

[registry]
endpoints = ["http://127.0.0.1:2379"]
relays = ["http://10.0.0.9:2381"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(SPEC)
    return path


@pytest.mark.parametrize(
    ("flags", "env", "relays"),
    [
        pytest.param([], {}, ("http://10.0.0.9:2381",), id="the-spec"),
        pytest.param([], {"VNETD_RELAYS": "http://a:1, http://b:2"}, ("http://a:1", "http://b:2"),
                     id="the-environment"),
        pytest.param(["--relay", "http://c:3"], {"VNETD_RELAYS": "http://a:1"}, ("http://c:3",),
                     id="the-flag-first"),
    ],
)  # fmt: skip
def test_relays_come_from_the_flag_then_the_environment_then_the_spec(
    config: Path, flags: list[str], env: dict[str, str], relays: tuple[str, ...]
) -> None:
    args = build_parser().parse_args(["up", "--config", str(config), *flags])
    assert spec_from_args(args, env).registry.relays == relays


def test_a_relay_itself_reads_etcd_and_takes_no_relays(config: Path) -> None:
    args = build_parser().parse_args(["relay", "--config", str(config)])
    assert not hasattr(args, "relay")
    spec = spec_from_args(args, {"VNETD_RELAYS": "http://a:1"})
    assert spec.registry.relays == ("http://10.0.0.9:2381",)  # the command drops them itself


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        pytest.param(["--relay", "10.0.0.9:2381"], {}, r"--relay \(VNETD_RELAYS\): .*not an etcd URL",
                     id="flag"),
        pytest.param([], {"VNETD_RELAYS": "nope"}, r"--relay \(VNETD_RELAYS\): 'nope'", id="env"),
        pytest.param(["--relay", "ftp://r:2381"], {}, r"--relay \(VNETD_RELAYS\): .*not an etcd URL",
                     id="scheme"),
    ],
)  # fmt: skip
def test_a_bad_relay_url_names_where_it_came_from(
    config: Path, flags: list[str], env: dict[str, str], message: str
) -> None:
    args = build_parser().parse_args(["up", "--config", str(config), *flags])
    with pytest.raises(SpecError, match=message):
        spec_from_args(args, env)


def test_a_relay_serving_tls_is_named_with_https(config: Path) -> None:
    args = build_parser().parse_args(["up", "--config", str(config), "--relay", "https://r:2381"])
    assert spec_from_args(args, {}).registry.relays == ("https://r:2381",)


def test_a_bad_relay_in_the_spec_names_the_key(config: Path) -> None:
    config.write_text(SPEC.replace('"http://10.0.0.9:2381"', '"10.0.0.9:2381"'))
    args = build_parser().parse_args(["up", "--config", str(config)])
    with pytest.raises(SpecError, match=r"registry\.relays: .*not an etcd URL"):
        spec_from_args(args, {})
