"""The host reads ``vnetd up`` makes before its event loop starts (the default route's
address, the underlay's MTU): bounded in time, and a netlink failure named in one line
with the input and the fix (``link_reads.read_before_start``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vnetd.cli import build_parser
from vnetd.commands import up
from vnetd.dataplane.rtnetlink import link_reads as link
from vnetd.dataplane.rtnetlink.pyroute2_package import NetlinkError
from vnetd.errors import VnetdError

SPEC = """
[mesh]
name = "unit"
size = 4
network = "10.250.0.0/16"
{extra}
"""
HANG = 10.0
"""Seconds a stuck read waits at most (the bound under test is 0.2 s)."""


class Netlink:
    """An ``IPRoute`` whose every read fails with ``error`` or waits for ``released``."""

    def __init__(self, error: Exception | None, released: threading.Event) -> None:
        self.error, self.released = error, released

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _read(self, *args: Any, **kwargs: Any) -> list[Any]:  # noqa: ANN401
        if self.error is not None:
            raise self.error
        self.released.wait(HANG)
        return []

    get_default_routes = get_addr = get_links = route = _read


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: ANN401
    event = threading.Event()
    monkeypatch.setattr(link, "NETLINK_TIMEOUT", 0.2)
    yield event
    event.set()  # a stuck read's thread ends


def settings(tmp_path: Path, env: dict[str, str], extra: str = "") -> object:
    config = tmp_path / "mesh.toml"
    config.write_text(SPEC.format(extra=extra))
    return up.daemon_settings(build_parser().parse_args(["up", "--config", str(config),
                                                         "--rank", "1"]), env)  # fmt: skip


READS = [
    pytest.param({}, "", "^the endpoint: the default route's address: ",
                 "give --endpoint HOST:PORT or set POD_IP$", id="default-route"),
    pytest.param({"POD_IP": "198.18.0.8"}, "mtu = 'auto'", "^mesh.mtu: auto: the underlay's MTU: ",
                 "set mesh.mtu to a number$", id="underlay-mtu"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "extra", "head", "fix"), READS)
def test_a_netlink_error_is_one_line_naming_the_read_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: threading.Event,
    env: dict[str, str], extra: str, head: str, fix: str,
) -> None:  # fmt: skip
    refused = NetlinkError(1)
    monkeypatch.setattr(link, "_iproute", lambda netns: Netlink(refused, released))
    with pytest.raises(VnetdError, match=head) as caught:
        settings(tmp_path, env, extra)
    message = str(caught.value)
    assert "cannot read it: netlink error 1 (Operation not permitted); " in message
    assert "\n" not in message
    assert caught.match(fix)


@pytest.mark.parametrize(("env", "extra", "head", "fix"), READS)
def test_a_read_netlink_never_answers_ends_at_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: threading.Event,
    env: dict[str, str], extra: str, head: str, fix: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(link, "_iproute", lambda netns: Netlink(None, released))
    started = time.monotonic()
    with pytest.raises(VnetdError, match=f"{head}no answer from netlink within 0.2 s; {fix[:-1]}"):
        settings(tmp_path, env, extra)
    assert time.monotonic() - started < HANG
