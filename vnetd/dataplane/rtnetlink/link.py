"""The device's link, written: its set-up, an adopted link's stale addresses pruned,
the kernel's WireGuard link created or probed, and the link removed.

The rank's address (in a dual-stack mesh, each of its two) is added with
the network's prefix length and ``IFA_F_NOPREFIXROUTE`` so the kernel adds
no route for the whole network; should the kernel refuse that flag, the
address falls back to a /32 (/128), which routes the same. Each network
itself is routed ``unreachable`` (``fail_closed``) and each present peer's
allowed IPs get a route to the device (``linked_device``, invariant 9). The
unreachable routes stay when the link is removed: the overlay fails closed
while vnetd is down.

Every write here goes over ``link_socket`` on the event loop, in the daemon's own
namespace (``netns=None``) or a named one (the tests'): one path, the same
requests, so the contract suite proves what the daemon runs (docs/architecture.md,
"Data plane and routing"). Reads stay with pyroute2 (``link_reads``).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
from collections.abc import Collection
from ipaddress import ip_address, ip_interface

from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.codec.rtnetlink_wire import IFA_F_NOPREFIXROUTE, Address
from vnetd.dataplane.rtnetlink.fail_closed import route_unreachable
from vnetd.dataplane.rtnetlink.link_reads import link_addresses, run_netlink
from vnetd.dataplane.rtnetlink.link_socket import LINK_TIMEOUT, LinkSocket, open_link_socket
from vnetd.errors import DataplaneError

log = logging.getLogger("vnetd.dataplane")


async def set_up_link(
    netns: str | None,
    config: DeviceConfig,
    timeout: float = LINK_TIMEOUT,  # noqa: ASYNC109 (the bound of each request)
) -> tuple[int, bool]:
    """Addresses (no prefix route), MTU, up, ``unreachable`` for each network.

    Returns the link index and whether IFA_F_NOPREFIXROUTE was accepted (for
    every address). ``timeout`` bounds each request (a route dump included: an
    adopted link's routes come with it).

    Raises:
        DataplaneError: no such link, or the kernel refused or did not answer.
    """
    async with open_link_socket(netns, timeout) as link:
        index = await link.link_index(config.interface)
        if index is None:
            raise DataplaneError(f"interface {config.interface}: not found after start")
        noprefixroute = True
        for addr in config.addresses:
            noprefixroute &= await _add_address(link, index, config.interface, addr)
        await link.set_link_up(index, config.mtu)
        for network in config.networks:
            await route_unreachable(link, network)
    return index, noprefixroute


async def _add_address(link: LinkSocket, index: int, interface: str, addr: Address) -> bool:
    """Add ``addr`` with IFA_F_NOPREFIXROUTE, else as a host address; whether the flag held."""
    code = await link.add_address(index, addr, addr.network.prefixlen, IFA_F_NOPREFIXROUTE)
    if code in (0, errno.EEXIST):
        return True
    log.warning(
        "%s: IFA_F_NOPREFIXROUTE refused (%s); using a host address", interface, os.strerror(code)
    )
    code = await link.add_address(index, addr, addr.max_prefixlen, 0)
    if code not in (0, errno.EEXIST):
        raise DataplaneError(
            f"netlink: address {addr.ip}/{addr.max_prefixlen}: {os.strerror(code)}"
        )
    return False


async def prune_addresses(netns: str | None, index: int, keep: Collection[str]) -> list[str]:
    """Delete the link's addresses other than those in ``keep`` (link-local ones stay).

    For a device adopted from a previous run that had another rank, whose
    addresses would otherwise stay on the link. Returns those removed (CIDR).
    """
    kept = {ip_address(addr) for addr in keep}
    found = await run_netlink(lambda: link_addresses(netns, index))
    stale = [
        ip_interface(f"{addr}/{prefixlen}")
        for addr, prefixlen in found
        if ip_address(addr) not in kept and not ip_address(addr).is_link_local
    ]
    if stale:
        async with open_link_socket(netns) as link:
            for addr in stale:
                await link.delete_address(index, addr, addr.network.prefixlen)
    return [str(addr) for addr in stale]


async def create_wireguard_link(netns: str | None, name: str) -> int:
    """Create an in-kernel WireGuard link called ``name``; returns its index.

    Raises:
        DataplaneError: the kernel refused (``EOPNOTSUPP``: no WireGuard module).
    """
    async with open_link_socket(netns) as link:
        return await link.create_wireguard_link(name)


async def kernel_unavailable(netns: str | None = None) -> str | None:
    """Why the kernel's WireGuard cannot be used here, or None when it can.

    Creates a probe link (a name of its own) and deletes it at once.
    """
    name = f"vnetdprobe{secrets.randbelow(100000)}"
    try:
        async with open_link_socket(netns) as link:
            return await link.wireguard_link_refused(name)
    except DataplaneError as exc:
        return str(exc)
    except OSError as exc:
        return f"creating a wireguard link: {exc.strerror or exc}"


async def remove_link(
    netns: str | None,
    config: DeviceConfig,
    timeout: float = LINK_TIMEOUT,  # noqa: ASYNC109 (the bound of each request)
) -> None:
    """Delete the link (its peer routes go with it); keep the unreachable routes.

    Fail closed: an ``unreachable`` route has no device, so it outlives the
    link, and while vnetd is down (a sidecar restarting beside a running
    application) a packet to an overlay address fails with "No route to
    host" instead of following the pod's default route into the cluster
    network. The next start finds the routes and keeps them
    (``set_up_link`` replaces a route to the network, ours or not).

    Raises:
        DataplaneError: the kernel refused, or did not answer within ``timeout`` s.
    """
    try:
        async with open_link_socket(netns, timeout) as link:
            await link.delete_link(config.interface)
    except OSError:
        return  # the namespace is gone, and everything in it
