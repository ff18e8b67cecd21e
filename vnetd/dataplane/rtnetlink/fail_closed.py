"""The overlay network's ``unreachable`` route (invariant 9, fail closed).

Made with ``replace``, not ``add``: an ``add`` that ignores EEXIST leaves a route to
exactly the overlay network that something else made (``ip route add <network> via
<gateway>``) in place, and packets to absent ranks then follow it out of the pod
while vnetd runs and after it stops. A route to the network with another metric is
kept, but ours (metric 0) shadows it. Either is logged, once per start.
"""

from __future__ import annotations

import logging

from vnetd.dataplane.codec.rtnetlink_wire import RTN_UNREACHABLE, Network
from vnetd.dataplane.rtnetlink.link_socket import LinkSocket

log = logging.getLogger("vnetd.dataplane")


async def route_unreachable(link: LinkSocket, network: Network) -> None:
    """Route ``network`` ``unreachable`` in the main table over ``link``, over any
    route to it (logged)."""
    for route in await link.routes_to(network):
        if route.type != RTN_UNREACHABLE:
            log_replaced(network, route.gateway, route.oif, route.priority)
    await link.route_unreachable(network)


def log_replaced(
    network: Network, gateway: str | None, oif: int | None, metric: int | None
) -> None:
    """The line about a route to the overlay network that ``replace`` takes over."""
    log.warning(
        "%s: a route to the overlay network via %s (metric %s) was there; routing "
        "the network unreachable so that no overlay packet leaves by it",
        network,
        gateway or f"interface index {oif}",
        metric or 0,
    )
