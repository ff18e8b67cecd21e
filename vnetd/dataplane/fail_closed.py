"""The overlay network's ``unreachable`` route (invariant 9, fail closed).

Made with ``replace``, not ``add``: an ``add`` that ignores EEXIST leaves a route to
exactly the overlay network that something else made (``ip route add <network> via
<gateway>``) in place, and packets to absent ranks then follow it out of the pod
while vnetd runs and after it stops. A route to the network with another metric is
kept, but ours (metric 0) shadows it. Either is logged, once per start.
"""

from __future__ import annotations

import logging
import socket
from ipaddress import IPv4Network, IPv6Network
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vnetd.dataplane.pyroute2_package import IPRoute

log = logging.getLogger("vnetd.dataplane")

RT_TABLE_MAIN = 254
RTN_UNREACHABLE = 7


def route_unreachable(ipr: IPRoute, network: IPv4Network | IPv6Network) -> None:
    """Route ``network`` ``unreachable`` in the main table, over any route to it."""
    family = socket.AF_INET6 if network.version == 6 else socket.AF_INET
    wanted = (str(network.network_address), network.prefixlen, RT_TABLE_MAIN)
    for route in ipr.route("dump", family=family):
        found = (route.get("dst"), route.get("dst_len"), route.get("table"))
        if found == wanted and route.get("type") != RTN_UNREACHABLE:
            log_replaced(network, route.get("gateway"), route.get("oif"), route.get("priority"))
    ipr.route("replace", dst=str(network), type="unreachable")


def log_replaced(
    network: IPv4Network | IPv6Network, gateway: str | None, oif: int | None, metric: int | None
) -> None:
    """The line about a route to the overlay network that ``replace`` takes over."""
    log.warning(
        "%s: a route to the overlay network via %s (metric %s) was there; routing "
        "the network unreachable so that no overlay packet leaves by it",
        network,
        gateway or f"interface index {oif}",
        metric or 0,
    )
