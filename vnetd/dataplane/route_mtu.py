"""One peer's host route with a locked MTU: what the probe service does about a black hole.

When a peer's path drops packets above some size with no ICMP back, the
kernel never learns the path MTU and every bulk transfer to that peer hangs.
Setting ``mtu lock N`` on the peer's own host route (the /32 or /128 the
data plane manages, invariant 9) makes the kernel use N for that
destination: TCP's MSS follows, datagrams above N fail with EMSGSIZE at the
sender instead of vanishing. The route keeps its destination, device and
protocol, so the data plane's own changes (by destination) still match it;
it goes with the peer, and a lock never creates a route. See docs/architecture.md, "Doctor".
"""

from __future__ import annotations

from functools import partial

from vnetd.dataplane.link import run_netlink
from vnetd.dataplane.pyroute2_package import IPRoute

RTAX_MTU = 2
RTPROT_STATIC = 4


def _lock(interface: str, destination: str, mtu: int) -> None:
    with IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=interface)
        ipr.route(
            "change",  # never "replace": that would add the route of a peer that has left
            dst=destination,
            oif=index,
            proto=RTPROT_STATIC,
            metrics={"mtu": mtu, "lock": 1 << RTAX_MTU},
        )


async def lock_route_mtu(interface: str, destination: str, mtu: int) -> None:
    """``ip route change <destination> dev <interface> proto static mtu lock <mtu>``: the
    peer's host route only if it is there (a peer that left meanwhile gets no route
    back: its address must stay "No route to host", invariant 9).

    Raises:
        DataplaneError: netlink did not answer in time.
        NetlinkError, ValueError: the interface or route is not there.
    """
    await run_netlink(partial(_lock, interface, destination, mtu))
