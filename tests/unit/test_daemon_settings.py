"""``vnetd up``'s inputs resolved once into ``DaemonSettings``: the host read only when
needed, the record frozen, and what the environment said handed down as values (the
data-plane kinds listed once, too). See docs/architecture.md, "Module map"."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from shared import daemon_settings

from vnetd import identity
from vnetd.cli import build_parser
from vnetd.commands import up
from vnetd.config import Settings
from vnetd.daemon.root import device_config
from vnetd.dataplane.rtnetlink import link_reads as link
from vnetd.dataplane.select import dataplane_factory
from vnetd.dataplane.wireguard_go import device as uapi
from vnetd.dataplane.wireguard_go import supervise
from vnetd.errors import DataplaneError, SpecError, VnetdError
from vnetd.spec import DATAPLANE_KINDS, DATAPLANES, load_spec, parse_spec

SPEC = """
[mesh]
name = "unit"
size = 4
network = "10.250.0.0/16"
hostname = "unit-{{rank}}"
{extra}
"""


def parsed(tmp_path: Path, *flags: str, extra: str = "") -> Any:  # noqa: ANN401
    config = tmp_path / "mesh.toml"
    config.write_text(SPEC.format(extra=extra))
    return build_parser().parse_args(["up", "--config", str(config), *flags])


class HostReads:
    """The host probes ``vnetd up`` may call, answering as a host with a default route
    through an underlay of MTU 1500, and counting the calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        monkeypatch.setattr(link, "default_route_address", self.default_route_address)
        monkeypatch.setattr(link, "underlay_mtu", self.underlay_mtu)

    def default_route_address(self) -> str:
        self.calls.append("default route")
        return "198.18.0.7"

    def underlay_mtu(self, netns: str | None, host: str) -> tuple[str, int]:
        self.calls.append(f"underlay of {host}")
        return "eth0", 1500


@pytest.mark.parametrize(
    ("flags", "env", "endpoint", "calls"),
    [
        pytest.param(["--endpoint", "198.18.0.9:4000"], {}, "198.18.0.9:4000", [], id="flag"),
        pytest.param([], {"POD_IP": "198.18.0.8"}, "198.18.0.8:51820", [], id="pod-ip"),
        pytest.param([], {}, "198.18.0.7:51820", ["default route"], id="default-route"),
    ],
)
def test_the_default_route_is_read_only_when_no_flag_or_pod_ip_gives_the_endpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    env: dict[str, str],
    endpoint: str,
    calls: list[str],
) -> None:
    host = HostReads(monkeypatch)
    settings = up.daemon_settings(parsed(tmp_path, "--rank", "1", *flags), env)
    assert (settings.endpoint, settings.mtu) == (endpoint, 1420)
    assert host.calls == calls


def test_the_underlay_mtu_is_read_only_for_auto(tmp_path: Path, monkeypatch) -> None:
    host = HostReads(monkeypatch)
    env = {"POD_IP": "198.18.0.8"}
    settings = up.daemon_settings(parsed(tmp_path, "--rank", "1", extra="mtu = 'auto'"), env)
    assert (settings.mtu, host.calls) == (1500 - 60, ["underlay of 198.18.0.8"])


def test_the_record_is_resolved_flag_then_environment_then_spec(tmp_path: Path) -> None:
    args = parsed(tmp_path, "--site", "b", extra="[site]\nname = 'c'")
    env = {
        "POD_IP": "198.18.0.8",
        "VNETD_RANK": "auto",
        "POD_NAME": "pod-x",
        "VNETD_SITE": "a",
        "VNETD_PUBLIC_ENDPOINT": "203.0.113.1:9",
        "VNETD_WIREGUARD_LOG": "verbose",
    }
    settings = up.daemon_settings(args, env)
    assert (settings.rank, settings.instance, settings.site) == ("auto", "pod-x", "b")
    assert (settings.public_endpoint, settings.wireguard_log) == ("203.0.113.1:9", "verbose")
    assert settings.child_env == env
    env["VNETD_WIREGUARD_LOG"] = "silent"  # read once: what the record holds stays
    assert (settings.wireguard_log, settings.child_env["VNETD_WIREGUARD_LOG"]) == (
        "verbose",
        "verbose",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rank = 1  # type: ignore[misc]


def test_without_flag_or_environment_the_hostname_gives_rank_and_instance(tmp_path) -> None:
    flags = Settings(spec=load_spec(parsed(tmp_path).config))
    settings = daemon_settings(flags, {"POD_IP": "198.18.0.8"}, hostname="unit-3")
    assert (settings.rank, settings.instance, settings.wireguard_log) == (3, "unit-3", "error")


def test_a_bad_input_is_named_before_the_host_is_read_further(tmp_path, monkeypatch) -> None:
    host = HostReads(monkeypatch)
    with pytest.raises(VnetdError, match="^POD_IP: 'x' is not an IP address$"):
        up.daemon_settings(parsed(tmp_path, "--rank", "1", extra="mtu = 'auto'"), {"POD_IP": "x"})
    assert host.calls == []


def test_a_bad_rank_is_named_before_the_host_is_read(tmp_path, monkeypatch) -> None:
    """As before the record: the rank is the first input named, then the endpoint."""
    host = HostReads(monkeypatch)
    args = parsed(tmp_path, "--rank", "9", extra="mtu = 'auto'")
    with pytest.raises(VnetdError, match="^--rank: rank 9 is out of range"):
        up.daemon_settings(args, {"POD_IP": "x"})
    assert host.calls == []


def test_a_done_job_is_seen_before_any_input_is_resolved(tmp_path, monkeypatch, caplog) -> None:
    """As before the record: a container restarted after its job ended exits 0 on the exit
    file, whatever its rank sources say now, and reads nothing of the host."""
    host = HostReads(monkeypatch)
    for name in ("VNETD_RANK", "JOB_COMPLETION_INDEX", "POD_IP", "VNETD_EXIT_ON_FILE"):
        monkeypatch.delenv(name, raising=False)
    done = tmp_path / "done"
    done.touch()
    args = parsed(tmp_path, "--exit-on-file", str(done), extra="mtu = 'auto'")
    with caplog.at_level(logging.INFO, logger="vnetd.daemon"):
        assert up.run(args) == 0
    assert f"{done} exists: the job is done; not starting" in caplog.text
    assert host.calls == []


# --- what the record hands down -------------------------------------------------------------


def test_the_device_gets_the_log_level_and_the_environment_it_starts_wireguard_go_with(
    tmp_path: Path,
) -> None:
    flags = Settings(spec=load_spec(parsed(tmp_path).config), rank="2")
    env = {"POD_IP": "198.18.0.8", "VNETD_WIREGUARD_LOG": "verbose", "GOMAXPROCS": "1"}
    config = device_config(daemon_settings(flags, env), 2, "k")
    assert (config.wireguard_log, dict(config.child_env)) == ("verbose", env)
    assert "GOMAXPROCS" not in repr(config)


async def test_the_uapi_data_plane_starts_wireguard_go_with_what_the_device_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = Settings(spec=load_spec(parsed(tmp_path).config), rank="2")
    env = {"POD_IP": "198.18.0.8", "VNETD_WIREGUARD_LOG": "verbose"}
    config = device_config(daemon_settings(flags, env), 2, "k")
    started: list[tuple[Any, ...]] = []

    async def no_socket(interface: str) -> supervise.SocketProbe:
        return supervise.SocketProbe("/nowhere", "absent")

    async def no_link(netns: str | None, interface: str) -> None:
        return None

    async def start(*args: object) -> Any:  # noqa: ANN401
        started.append(args)
        return "process"

    monkeypatch.setattr(uapi, "probe_socket", no_socket)
    monkeypatch.setattr(uapi, "existing_link_kind", no_link)
    monkeypatch.setattr(uapi, "start_wireguard_go", start)
    assert await uapi.adopt_or_start(config, None, "wireguard-go") == ("process", None)
    assert started == [(config.interface, None, "wireguard-go", "verbose", config.child_env)]


async def test_wireguard_go_runs_with_the_log_level_and_the_environment_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervise, "SOCKET_DIR", str(tmp_path))
    dump = tmp_path / "env"
    script = tmp_path / "wireguard-go"
    script.write_text(f"#!/bin/sh\nenv > {dump}\nexit 3\n")
    script.chmod(0o755)
    with trio.fail_after(10), pytest.raises(DataplaneError, match="exited at start with code 3"):
        await supervise.start_wireguard_go(
            "vnetdunit0", None, str(script), "verbose", {"FROM_THE_DAEMON": "1"}
        )
    seen = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert (seen["LOG_LEVEL"], seen["FROM_THE_DAEMON"]) == ("verbose", "1")
    assert seen["WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD"] == "1"


# --- the data-plane kinds -------------------------------------------------------------------


def test_the_data_plane_kinds_are_ups_choices_the_ports_and_the_specs_but_fake() -> None:
    (dataplane,) = [
        action
        for sub in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for action in sub.choices["up"]._actions
        if action.dest == "dataplane"
    ]
    assert tuple(dataplane.choices) == DATAPLANE_KINDS
    assert DATAPLANES == tuple(kind for kind in DATAPLANE_KINDS if kind != "fake")
    for kind in DATAPLANE_KINDS:
        if kind != "auto":
            assert callable(dataplane_factory(kind))
    with pytest.raises(VnetdError, match="^--dataplane: 'x' is not one of auto, kernel, user"):
        dataplane_factory("x")
    mesh = {"name": "m", "size": 2, "network": "10.250.0.0/16"}
    with pytest.raises(SpecError, match="wireguard.dataplane: 'fake' is not one of auto, k"):
        parse_spec({"mesh": mesh, "wireguard": {"dataplane": "fake"}})


@pytest.mark.parametrize(
    ("flags", "env", "rank"),
    [
        pytest.param(["--rank", "1"], {}, 1, id="flag"),
        pytest.param([], {"VNETD_RANK": "2"}, 2, id="variable"),
        pytest.param([], {"JOB_COMPLETION_INDEX": "3"}, 3, id="job-index"),
    ],
)
def test_the_rank_is_resolved_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    env: dict[str, str],
    rank: int,
) -> None:
    """``vnetd up`` resolves the rank before it reads the host, and the record takes
    that rank instead of resolving it again."""
    calls: list[str | None] = []
    resolve = identity.resolve_rank

    def counted(spec: Any, flag: str | None, env: Any, hostname: str) -> int:  # noqa: ANN401
        calls.append(flag)
        return resolve(spec, flag, env, hostname)

    monkeypatch.setattr(identity, "resolve_rank", counted)
    settings = up.daemon_settings(parsed(tmp_path, *flags), {"POD_IP": "198.18.0.8", **env})
    assert (settings.rank, len(calls)) == (rank, 1)
