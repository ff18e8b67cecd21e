"""The device's set-up over ``link_socket`` (the daemon's own namespace) against the
kernel: run in a process inside a namespace this test makes, on a veth link in
place of wireguard-go's tun, and read back with ``ip``. It also checks that the
set-up imported no pyroute2 ``IPRoute`` (docs/architecture.md, "Start-up"), and that
what still uses ``IPRoute`` imports it (the default route's address)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from itertools import count

import pytest


def skip_without_namespaces() -> None:
    """Skip without root or ``ip``; under ``CI`` (the variable set) run and fail instead,
    as the other contract cases that need the host do (``conftest.py``)."""
    if (os.geteuid() != 0 or shutil.which("ip") is None) and not os.environ.get("CI"):
        pytest.skip("needs root and ip (network namespaces)")


_names = count()

SET_UP = """
import json, logging, sys
from ipaddress import ip_interface, ip_network
import trio
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.link import existing_link_kind, kernel_unavailable, set_up_link

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
config = DeviceConfig(
    interface="d0", private_key="", listen_port=51820, mtu=1380,
    address=ip_interface("10.250.0.1/16"), network=ip_network("10.250.0.0/16"),
    address6=ip_interface("fd00:250::1/64"), network6=ip_network("fd00:250::/64"),
)

async def main():
    before = await existing_link_kind(None, "nothere")
    refused = await kernel_unavailable()
    index, noprefixroute = await set_up_link(None, config)
    again = await set_up_link(None, config)  # a restart finds it all there
    print(json.dumps({"before": before, "refused": refused, "index": index,
                      "noprefixroute": noprefixroute, "again": list(again),
                      "iproute": "pyroute2.iproute.linux" in sys.modules}))

trio.run(main)
"""


@pytest.fixture
def netns() -> Iterator[str]:
    skip_without_namespaces()
    name = f"vnls-{os.getpid()}-{next(_names)}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)


def ip(netns: str, *args: str) -> list[dict[str, object]]:
    result = subprocess.run(
        ["ip", "-n", netns, "-j", *args], capture_output=True, text=True, check=True, timeout=10
    )
    return list(json.loads(result.stdout or "[]"))


def test_set_up_in_own_namespace(netns: str) -> None:
    subprocess.run(
        ["ip", "-n", netns, "link", "add", "d0", "type", "veth", "peer", "d1"], check=True
    )
    # A route to exactly the overlay network that something else made: replaced, logged.
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-n", netns, "route", "add", "10.250.0.0/16", "dev", "lo"], check=True)
    result = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", SET_UP],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    outcome = json.loads(lines[-1])
    assert outcome["before"] is None
    assert outcome["iproute"] is False
    assert outcome["noprefixroute"] is True
    assert outcome["again"] == [outcome["index"], True]
    refused = outcome["refused"]
    assert refused is None or refused.startswith("creating a wireguard link: ")
    assert any("a route to the overlay network via interface index" in line for line in lines)
    link = ip(netns, "addr", "show", "dev", "d0")[0]
    assert link["mtu"] == 1380
    assert "UP" in link["flags"]
    addresses = {(a["local"], a["prefixlen"], "noprefixroute" in a) for a in link["addr_info"]}
    assert ("10.250.0.1", 16, True) in addresses
    assert ("fd00:250::1", 64, True) in addresses
    for family, network in (("-4", "10.250.0.0/16"), ("-6", "fd00:250::/64")):
        routes = ip(netns, family, "route", "show", "table", "main", "to", "exact", network)
        assert [(r["type"], r["dst"]) for r in routes] == [("unreachable", network)]
    assert not any(link["ifname"].startswith("vnetdprobe") for link in ip(netns, "link", "show"))


DEFAULT_ROUTE = """
import sys
from vnetd.dataplane.link import default_route_address
print(default_route_address())
"""


def test_the_default_route_address_is_read_in_the_namespace(netns: str) -> None:
    """What ``vnetd up`` advertises when no endpoint or POD_IP is given (the Flux
    Operator's pods): read with ``IPRoute``, which the module imports at first use."""
    for command in (
        ["link", "add", "d0", "type", "veth", "peer", "d1"],
        ["link", "set", "d0", "up"],
        ["link", "set", "d1", "up"],
        ["addr", "add", "198.18.7.2/24", "dev", "d0"],
        ["route", "add", "default", "via", "198.18.7.1"],
    ):
        subprocess.run(["ip", "-n", netns, *command], check=True, timeout=10)
    result = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", DEFAULT_ROUTE],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["198.18.7.2"]
