"""One peer's host route with a locked MTU: what the probe service does about a black hole.

When a peer's path drops packets above some size with no ICMP back, the
kernel never learns the path MTU and every bulk transfer to that peer hangs.
Setting ``mtu lock N`` on the peer's own host route (the /32 or /128 the
data plane manages, invariant 9) makes the kernel use N for that
destination: TCP's MSS follows, datagrams above N fail with EMSGSIZE at the
sender instead of vanishing. The route keeps its destination, device and
protocol, so the data plane's own changes (by destination) still match it;
it goes with the peer, and a lock never creates a route. Sent over
``link_socket`` like every route write (``rtnetlink_wire.mtu_lock_route``). See
docs/architecture.md, "Doctor".
"""

from __future__ import annotations

from vnetd.dataplane.rtnetlink.link_socket import open_link_socket
from vnetd.errors import DataplaneError


async def lock_route_mtu(
    interface: str, destination: str, mtu: int, netns: str | None = None
) -> None:
    """``ip route change <destination> dev <interface> proto static mtu lock <mtu>``: the
    peer's host route only if it is there (a peer that left meanwhile gets no route
    back: its address must stay "No route to host", invariant 9).

    Raises:
        DataplaneError: the interface or route is not there, or netlink did not
            answer in time.
    """
    async with open_link_socket(netns) as link:
        index = await link.link_index(interface)
        if index is None:
            raise DataplaneError(f"interface {interface}: not found")
        # "change", never "replace": that would add the route of a peer that has left.
        await link.lock_route_mtu(destination, index, mtu)
