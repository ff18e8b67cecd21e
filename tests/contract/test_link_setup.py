"""The device's link writes over ``link_socket`` against the kernel, on a veth link in
place of wireguard-go's tun, read back with ``ip``: in the daemon's own namespace
(a process run inside a namespace this test makes), and the same functions asked
for a named namespace from outside it (as the contract suite and the kernel data
plane's tests call them). It also checks that the set-up imported no pyroute2
``IPRoute`` (docs/architecture.md, "Start-up"), and that what still uses ``IPRoute``
imports it (the default route's address)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import ip_interface, ip_network
from itertools import count

import pytest
import trio

from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.rtnetlink.link import (
    kernel_unavailable,
    prune_addresses,
    remove_link,
    set_up_link,
)
from vnetd.dataplane.rtnetlink.route_mtu import lock_route_mtu
from vnetd.dataplane.rtnetlink.route_socket import RouteSocket
from vnetd.errors import DataplaneError


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
from vnetd.dataplane.rtnetlink.link import kernel_unavailable, set_up_link
from vnetd.dataplane.rtnetlink.link_reads import existing_link_kind

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
from vnetd.dataplane.rtnetlink.link_reads import default_route_address
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


async def test_the_same_writes_asked_for_a_named_namespace(netns: str) -> None:
    """The set-up, a repair (stale address, peer routes), the MTU lock and the removal,
    each asked for the namespace by name from outside it: the requests the daemon
    sends in its own, over a socket opened there."""
    for command in (
        ["link", "add", "d0", "type", "veth", "peer", "d1"],
        ["link", "set", "lo", "up"],
        ["route", "add", "10.250.0.0/16", "dev", "lo"],
    ):
        await trio.run_process(["ip", "-n", netns, *command])
    config = DeviceConfig(
        interface="d0", private_key="", listen_port=51820, mtu=1380,
        address=ip_interface("10.250.0.1/16"), network=ip_network("10.250.0.0/16"),
        address6=ip_interface("fd00:250::1/64"), network6=ip_network("fd00:250::/64"),
    )  # fmt: skip
    with trio.fail_after(30):
        refused = await kernel_unavailable(netns)
        assert refused is None or refused.startswith("creating a wireguard link: ")
        index, noprefixroute = await set_up_link(netns, config)
        assert noprefixroute is True
        assert await set_up_link(netns, config) == (index, True)  # a restart finds it all
        await trio.run_process(["ip", "-n", netns, "addr", "add", "10.250.0.77/16", "dev", "d0"])
        removed = await prune_addresses(netns, index, ["10.250.0.1", "fd00:250::1"])
        assert removed == ["10.250.0.77/16"]
        routes = RouteSocket(netns)
        try:
            await routes.change(index, set(), {"10.250.0.7/32", "fd00:250::7/128"})
            await lock_route_mtu("d0", "10.250.0.7/32", 1200, netns=netns)
            with pytest.raises(DataplaneError):
                await lock_route_mtu("d0", "10.250.0.8/32", 1200, netns=netns)  # never made
            shown = await trio.run_process(
                ["ip", "-n", netns, "route", "show", "10.250.0.7/32"], capture_stdout=True
            )
            locked = shown.stdout.decode().split()
            assert locked[:5] == ["10.250.0.7", "dev", "d0", "proto", "static"]
            assert "mtu lock 1200" in " ".join(locked)
            assert ip(netns, "route", "show", "10.250.0.8/32") == []
            link = ip(netns, "addr", "show", "dev", "d0")[0]
            assert (link["mtu"], "UP" in link["flags"]) == (1380, True)
            assert {(a["local"], a["prefixlen"]) for a in link["addr_info"]
                    if a["scope"] == "global"} == {("10.250.0.1", 16), ("fd00:250::1", 64)}  # fmt: skip
            await routes.change(index, {"10.250.0.7/32"}, set())
            assert ip(netns, "route", "show", "10.250.0.7/32") == []
        finally:
            routes.close()
        await remove_link(netns, config)
        await remove_link(netns, config)  # gone already: no error
    assert "d0" not in {link["ifname"] for link in ip(netns, "link", "show")}
    for family, network in (("-4", "10.250.0.0/16"), ("-6", "fd00:250::/64")):
        routes_left = ip(netns, family, "route", "show", "table", "main", "to", "exact", network)
        assert [(r["type"], r["dst"]) for r in routes_left] == [("unreachable", network)]
