"""Readiness: the interface holds the rank's address and is up, and the rank is claimed.

It does not wait for peers (that is ``vnetd wait``): a native sidecar's
startup probe gates the main container on it, and the main container needs
only its own address to bind. Once claimed, a rank stays ready through a
registry outage: the address is still ours (static stability).
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address

from vnetd.observe.http import Check

IFF_UP = 0x1


@dataclass(frozen=True)
class LinkState:
    exists: bool
    up: bool = False
    addresses: frozenset[str] = frozenset()


def readiness(link: LinkState, interface: str, address: str, claimed: bool) -> Check:
    """Whether a daemon with this link state and claim is ready, and why not."""
    if not link.exists:
        return Check(False, f"not ready: interface {interface} does not exist yet")
    if ip_address(address).compressed not in {ip_address(a).compressed for a in link.addresses}:
        return Check(False, f"not ready: {interface} does not hold {address} yet")
    if not link.up:
        return Check(False, f"not ready: {interface} is down")
    if not claimed:
        return Check(False, "not ready: the rank is not claimed yet (see the log for who holds it)")
    return Check(True, f"ready: {interface} holds {address}, rank claimed")


async def read_link_state(interface: str) -> LinkState:
    """The link's existence, IFF_UP flag and addresses in this network namespace.

    Raises:
        DataplaneError: netlink did not answer in time.
    """
    from pyroute2 import IPRoute

    from vnetd.dataplane.link import run_netlink

    def query() -> LinkState:
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=interface)
            if not found:
                return LinkState(False)
            index = found[0]
            link = ipr.get_links(index)[0]
            addresses = frozenset(
                str(msg.get_attr("IFA_ADDRESS")) for msg in ipr.get_addr(index=index)
            )
            return LinkState(True, bool(link["flags"] & IFF_UP), addresses)

    return await run_netlink(query)
