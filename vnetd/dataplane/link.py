"""The device's link, addresses and routes, and what the host tells about its
underlay (MTU, the default route's address), through pyroute2.

The rank's address (in a dual-stack mesh, each of its two) is added with
the network's prefix length and ``IFA_F_NOPREFIXROUTE`` so the kernel adds
no route for the whole network; should the kernel refuse that flag, the
address falls back to a /32 (/128), which routes the same. Each network
itself is routed ``unreachable`` and each present peer's allowed IPs get a
route to the device (invariant 9). The unreachable routes stay when the
link is removed: the overlay fails closed while vnetd is down.

pyroute2's calls here are sync; ``run_netlink`` runs a batch of them in a
worker thread with a timeout, never on the event loop. In the daemon's own
namespace the start's requests (the kernel probe, the link's set-up, whether the
link exists) go over ``link_socket`` on the event loop instead, so pyroute2's
``IPRoute`` is imported only when something else needs it (docs/architecture.md,
"Start-up").
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable, Collection, Iterable
from functools import partial
from ipaddress import IPv4Interface, IPv6Interface, ip_address, ip_network
from typing import TYPE_CHECKING, TypeVar

import trio

from vnetd.dataplane.base import DeviceConfig, LinkState, route_changes
from vnetd.dataplane.fail_closed import RTN_UNREACHABLE, log_replaced, route_unreachable
from vnetd.dataplane.link_socket import IFA_F_NOPREFIXROUTE, LinkSocket
from vnetd.dataplane.pyroute2_package import NetlinkError
from vnetd.dataplane.route_socket import RouteSocket
from vnetd.errors import DataplaneError, VnetdError
from vnetd.model import DevicePeer, Plan
from vnetd.spec import MeshSpec

if TYPE_CHECKING:
    from vnetd.dataplane.pyroute2_package import IPRoute

log = logging.getLogger("vnetd.dataplane")
daemon_log = logging.getLogger("vnetd.daemon")
"""The logger of the host probes' lines, as when the daemon made them (JSON logs name it)."""

NETLINK_TIMEOUT = 5.0  # one batch of netlink calls
ROUTE_ALLOWANCE = 0.05  # s more per route in a pyroute2 batch (1000 missed 5 s in the guest)
_RT_TABLE_MAIN = 254
_RTN_UNICAST = 1
_IFF_UP = 0x1

T = TypeVar("T")


async def run_netlink(fn: Callable[[], T], timeout: float = NETLINK_TIMEOUT) -> T:  # noqa: ASYNC109
    """Run a sync pyroute2 batch in a worker thread, bounded by ``timeout`` seconds.

    The first call imports pyroute2's ``IPRoute`` before, in a thread of its own and
    outside the bound: the bound is for the kernel's answer, and in the kernel tests'
    TCG guest that import alone takes seconds.
    """
    if "pyroute2.iproute.linux" not in sys.modules:
        await trio.to_thread.run_sync(_import_iproute)
    try:
        with trio.fail_after(timeout):
            return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except trio.TooSlowError:
        raise DataplaneError(f"netlink: no answer within {timeout:g} s") from None
    except NetlinkError as exc:
        raise DataplaneError(f"netlink: {exc}") from exc


def _import_iproute() -> None:
    from vnetd.dataplane.pyroute2_package import IPRoute  # noqa: F401 (imported for later)


def _iproute(netns: str | None) -> IPRoute:
    from vnetd.dataplane.pyroute2_package import IPRoute  # at first use: the module doc

    # flags=0: never create the namespace (pyroute2's default is O_CREAT).
    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


async def set_up_link(netns: str | None, config: DeviceConfig) -> tuple[int, bool]:
    """``configure_link``: over ``link_socket`` in our own namespace, else through
    pyroute2 in a thread."""
    if netns is not None:
        return await run_netlink(lambda: configure_link(netns, config))
    try:
        index = socket.if_nametoindex(config.interface)
    except OSError:
        raise DataplaneError(f"interface {config.interface}: not found after start") from None
    with LinkSocket() as link:
        noprefixroute = True
        for addr in config.addresses:
            noprefixroute &= await _add_address_here(link, index, config.interface, addr)
        await link.set_link_up(index, config.mtu)
        for network in config.networks:
            for route in await link.routes_to(network):
                if route.type != RTN_UNREACHABLE:
                    log_replaced(network, route.gateway, route.oif, route.priority)
            await link.route_unreachable(network)
    return index, noprefixroute


async def _add_address_here(
    link: LinkSocket, index: int, interface: str, addr: IPv4Interface | IPv6Interface
) -> bool:
    """``_add_address`` over ``link``."""
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


async def existing_link_kind(netns: str | None, name: str) -> str | None:
    """``link_kind`` in a thread; in our own namespace, None without netlink when no
    link has that name (a fresh pod)."""
    if netns is None:
        try:
            socket.if_nametoindex(name)
        except OSError:
            return None
    return await run_netlink(lambda: link_kind(netns, name))


async def kernel_unavailable(netns: str | None = None) -> str | None:
    """Why the kernel's WireGuard cannot be used here, or None when it can.

    Creates a probe link (a name of its own) and deletes it at once.
    """
    name = f"vnetdprobe{secrets.randbelow(100000)}"
    try:
        if netns is None:
            with LinkSocket() as link:
                return await link.wireguard_link_refused(name)
        return await run_netlink(lambda: kernel_wireguard_unavailable(netns, name))
    except DataplaneError as exc:
        return str(exc)


def _ignore(codes: tuple[int, ...], call: Callable[[], object]) -> None:
    try:
        call()
    except NetlinkError as exc:
        if exc.code not in codes:
            raise


def configure_link(netns: str | None, config: DeviceConfig) -> tuple[int, bool]:
    """Addresses (no prefix route), MTU, up, ``unreachable`` for each network.

    Returns the link index and whether IFA_F_NOPREFIXROUTE was accepted (for
    every address).
    """
    with _iproute(netns) as ipr:
        found = ipr.link_lookup(ifname=config.interface)
        if not found:
            raise DataplaneError(f"interface {config.interface}: not found after start")
        index = int(found[0])
        noprefixroute = True
        for addr in config.addresses:
            noprefixroute &= _add_address(ipr, index, config.interface, addr)
        ipr.link("set", index=index, mtu=config.mtu, state="up")
        for network in config.networks:
            route_unreachable(ipr, network)
    return index, noprefixroute


def _add_address(
    ipr: IPRoute, index: int, interface: str, addr: IPv4Interface | IPv6Interface
) -> bool:
    """Add ``addr`` with IFA_F_NOPREFIXROUTE, else as a host address; whether the flag held."""
    add = partial(ipr.addr, "add", index=index, address=str(addr.ip))
    try:
        _ignore(
            (errno.EEXIST,),
            lambda: add(prefixlen=addr.network.prefixlen, flags=IFA_F_NOPREFIXROUTE),
        )
    except NetlinkError as exc:
        log.warning("%s: IFA_F_NOPREFIXROUTE refused (%s); using a host address", interface, exc)
        _ignore((errno.EEXIST,), lambda: add(prefixlen=addr.max_prefixlen))
        return False
    return True


def link_kind(netns: str | None, name: str) -> str | None:
    """The kind of the link called ``name`` (``tun``, ``bridge``, ...), None if there is none.

    A link without link info (loopback, a physical NIC) is ``device``.
    """
    with _iproute(netns) as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return None
        kind = ipr.link("get", index=found[0])[0].get(("IFLA_LINKINFO", "IFLA_INFO_KIND"))
    return str(kind) if kind else "device"


def prune_addresses(netns: str | None, index: int, keep: Collection[str]) -> list[str]:
    """Delete the link's addresses other than those in ``keep`` (link-local ones stay).

    For a device adopted from a previous run that had another rank, whose
    addresses would otherwise stay on the link. Returns those removed (CIDR).
    """
    kept = {ip_address(addr) for addr in keep}
    removed: list[str] = []
    with _iproute(netns) as ipr:
        for msg in ipr.get_addr(index=index):
            addr, prefixlen = msg.get("IFA_ADDRESS"), msg["prefixlen"]
            if not addr or ip_address(addr) in kept or ip_address(addr).is_link_local:
                continue
            _ignore(
                (errno.EADDRNOTAVAIL,),
                partial(ipr.addr, "del", index=index, address=addr, prefixlen=prefixlen),
            )
            removed.append(f"{addr}/{prefixlen}")
    return removed


def sync_peer_routes(netns: str | None, index: int, held: set[str]) -> tuple[set[str], set[str]]:
    """Make the device's routes exactly ``held`` (the peers' allowed IPs, as CIDRs).

    Returns the routes removed and added (for a device adopted from a
    previous run, whose routes may have been changed meanwhile).
    """
    have = device_routes(netns, index)
    gone, new = have - held, held - have
    if gone or new:
        change_routes(netns, index, gone, new)
    return gone, new


def change_routes(netns: str | None, index: int, gone: set[str], new: set[str]) -> None:
    """Delete the routes to ``gone`` and add routes to the device for ``new``; idempotent."""
    with _iproute(netns) as ipr:
        for dst in sorted(gone):
            _ignore((errno.ESRCH, errno.ENOENT), partial(ipr.route, "del", dst=dst, oif=index))
        for dst in sorted(new):
            _ignore((errno.EEXIST,), partial(ipr.route, "add", dst=dst, oif=index))


def device_routes(netns: str | None, index: int) -> set[str]:
    """Destinations routed to the device in the main table (CIDR strings)."""
    found: set[str] = set()
    with _iproute(netns) as ipr:
        for route in ipr.get_routes():
            if (
                route.get("oif") != index
                or route.get("table") != _RT_TABLE_MAIN
                or route["type"] != _RTN_UNICAST
            ):
                continue
            default = "0.0.0.0" if route["family"] == 2 else "::"
            net = ip_network(f"{route.get('dst') or default}/{route['dst_len']}")
            if not net.is_link_local:
                found.add(str(net))
    return found


def remove_link(netns: str | None, config: DeviceConfig) -> None:
    """Delete the link (its peer routes go with it); keep the unreachable routes.

    Fail closed: an ``unreachable`` route has no device, so it outlives the
    link, and while vnetd is down (a sidecar restarting beside a running
    application) a packet to an overlay address fails with "No route to
    host" instead of following the pod's default route into the cluster
    network. The next start finds the routes and keeps them
    (``configure_link`` replaces a route to the network, ours or not).
    """
    try:
        ipr = _iproute(netns)
    except OSError:
        return  # the namespace is gone, and everything in it
    with ipr:
        for index in ipr.link_lookup(ifname=config.interface):
            _ignore((errno.ENODEV,), partial(ipr.link, "del", index=index))


def read_link_state(netns: str | None, interface: str) -> LinkState:
    """The link's existence, IFF_UP flag and addresses (sync; use ``run_netlink``)."""
    with _iproute(netns) as ipr:
        found = ipr.link_lookup(ifname=interface)
        if not found:
            return LinkState(False)
        index = found[0]
        link = ipr.get_links(index)[0]
        addresses = frozenset(str(msg.get_attr("IFA_ADDRESS")) for msg in ipr.get_addr(index=index))
        return LinkState(True, bool(link["flags"] & _IFF_UP), addresses)


def create_wireguard_link(netns: str | None, name: str) -> int:
    """Create an in-kernel WireGuard link called ``name``; returns its index.

    Raises:
        NetlinkError: the kernel refused (``EOPNOTSUPP``: no WireGuard module).
    """
    with _iproute(netns) as ipr:
        ipr.link("add", ifname=name, kind="wireguard")
        return int(ipr.link_lookup(ifname=name)[0])


def kernel_wireguard_unavailable(netns: str | None, probe_name: str) -> str | None:
    """Why a WireGuard link cannot be created here, or None when it can.

    Creates a link called ``probe_name`` and deletes it again at once.
    """
    try:
        create_wireguard_link(netns, probe_name)
    except NetlinkError as exc:
        hint = " (no wireguard kernel module)" if exc.code == errno.EOPNOTSUPP else ""
        return f"creating a wireguard link: {exc.args[-1] if exc.args else exc}{hint}"
    except OSError as exc:
        return f"creating a wireguard link: {exc.strerror or exc}"
    with _iproute(netns) as ipr:
        for index in ipr.link_lookup(ifname=probe_name):
            _ignore((errno.ENODEV,), partial(ipr.link, "del", index=index))
    return None


IPV4_OVERHEAD = 60
"""WireGuard's per-packet overhead over an IPv4 underlay: 20 IP + 8 UDP + 32 WireGuard."""
IPV6_OVERHEAD = 80
"""The same over an IPv6 underlay: 40 IP + 8 UDP + 32 WireGuard."""


def underlay_mtu(netns: str | None, host: str) -> tuple[str, int]:
    """The name and MTU of the underlay interface for our endpoint ``host``.

    The interface that holds ``host`` (the pod's own address), else the one
    the route to ``host`` leaves by (an endpoint behind NAT), else the one of
    the default route of ``host``'s family.

    Raises:
        DataplaneError: none of these exists.
    """
    addr = ip_address(host)
    family = 2 if addr.version == 4 else 10
    with _iproute(netns) as ipr:
        index: int | None = None
        for msg in ipr.get_addr(family=family):
            if msg.get("IFA_ADDRESS") == str(addr):
                index = int(msg["index"])
                break
        if index is None:
            try:
                routes = ipr.route("get", dst=str(addr))
            except NetlinkError:
                routes = []
            oif = routes[0].get("RTA_OIF") if routes else None
            if oif is None:
                defaults = ipr.get_default_routes(family=family)
                oif = defaults[0].get("RTA_OIF") if defaults else None
            index = int(oif) if oif is not None else None
        if index is None:
            raise DataplaneError(
                f"mesh.mtu: auto: no interface holds {addr} and there is no route to it; "
                "set mesh.mtu to a number"
            )
        link = ipr.get_links(index)[0]
        return str(link.get("IFLA_IFNAME")), int(link.get("IFLA_MTU"))


def moves_addresses(plan: Plan) -> bool:
    """Whether ``plan`` removes a peer or changes allowed IPs (routes may have to stay)."""
    return bool(plan.remove) or any(upd.allowed_ips is not None for upd in plan.update)


def _cidr(ip: str) -> str:
    return str(ip_network(ip, strict=False))


def auto_mtu(underlay: int, host: str) -> int:
    """The overlay MTU for an underlay MTU and our endpoint's family."""
    overhead = IPV4_OVERHEAD if ip_address(host).version == 4 else IPV6_OVERHEAD
    return underlay - overhead


def resolve_mtu(spec: MeshSpec, endpoint: str, netns: str | None = None) -> int:
    """The spec's MTU; for ``auto`` the underlay's MTU minus WireGuard's overhead
    for our endpoint's family (sync: netlink)."""
    if isinstance(spec.mtu, int):
        return spec.mtu
    host = endpoint.rpartition(":")[0].strip("[]")
    try:
        ifname, underlay = underlay_mtu(netns, host)
    except OSError as exc:
        raise VnetdError(f"mesh.mtu: auto: cannot read the underlay's MTU: {exc}") from None
    mtu = auto_mtu(underlay, host)
    low = spec.min_mtu
    if mtu < low:
        raise VnetdError(
            f"mesh.mtu: auto gives {mtu} (underlay {ifname} mtu {underlay}), below the "
            f"minimum {low}; set mesh.mtu to a number"
        )
    daemon_log.info(
        "mtu auto: %d (underlay %s mtu %d minus %d for an IPv%d endpoint)",
        mtu,
        ifname,
        underlay,
        underlay - mtu,
        ip_address(host).version,
    )
    return mtu


def default_route_address() -> str | None:
    """The first address of the interface that holds the IPv4 (else IPv6) default route."""
    with _iproute(None) as ipr:
        for family in (socket.AF_INET, socket.AF_INET6):
            for route in ipr.get_default_routes(family=family):
                oif = route.get("RTA_OIF")
                for addr in ipr.get_addr(family=family, index=oif):
                    value = addr.get("IFA_ADDRESS")
                    if value:
                        return str(value)
    return None


class LinkedDevice:
    """What both real data planes do on the link side, whatever drives WireGuard.

    Routes follow the peers' allowed IPs after every change, and a link
    adopted from a previous run is repaired. A subclass sets ``config``,
    ``netns``, ``index`` (once the link is configured) and ``_lock``.
    """

    config: DeviceConfig
    netns: str | None
    index: int
    _lock: trio.Lock
    _route_socket: RouteSocket | None = None
    _routes_unsure = False
    """A change failed part-way: peers may be on the device without their routes."""

    async def _apply_then_route(
        self,
        plan: Plan,
        write: Callable[[bool], Awaitable[set[str]]],
        start_handshakes: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Under the lock: ``write`` the plan to the device, add and delete routes to
        match (``route_changes``), then ``start_handshakes`` (the plan's ``handshake``).

        The handshakes start only once the routes are in: a handshake completes in
        well under a millisecond between two pods, and the peer then sends what it
        held for us at once (a TCP SYN, say); our answer (the SYN-ACK) routed while
        the peer's route is not yet in meets the ``unreachable`` overlay route and is
        dropped, and TCP sends it again a second later (seen in bench/launcher.py:
        one such second for 5 of 31 workers at 32 pods, each counted as
        ``IpOutNoRoutes`` on rank 0).

        ``write(True)`` returns the allowed IPs the device then holds: asked only
        when the plan removes a peer or moves allowed IPs, where a route may have
        to stay for another peer. A plan of adds and endpoint updates takes no
        route away and every IP it adds is live once written, so the device is
        not read back (a read is O(peers), invariant 11).
        """
        async with self._lock:
            start = trio.current_time()
            reread = moves_addresses(plan)
            # Until the routes follow the plan, a failure (or a cancel) may leave peers
            # on the device without theirs: the next read of the peers repairs them.
            self._routes_unsure = True
            live = await write(reread)
            if not reread:
                live = {_cidr(ip) for peer in plan.add for ip in peer.allowed_ips}
            gone, new = route_changes(plan, live)
            if gone or new:
                await self._change_routes(gone, new)
            self._routes_unsure = False
            if start_handshakes is not None:
                await start_handshakes()
            elapsed = (trio.current_time() - start) * 1000
        log.debug(
            "%s: applied %s (routes -%d +%d) in %.1f ms",
            self.config.interface,
            plan.describe(limit=16),
            len(gone),
            len(new),
            elapsed,
        )

    async def _change_routes(self, gone: set[str], new: set[str]) -> None:
        """In the daemon's own namespace over one long-lived netlink socket on the
        event loop (``route_socket``); in another through pyroute2 in a thread."""
        netns, index = self.netns, self.index
        if netns is not None:
            bound = NETLINK_TIMEOUT + ROUTE_ALLOWANCE * (len(gone) + len(new))
            return await run_netlink(lambda: change_routes(netns, index, gone, new), bound)
        self._route_socket = self._route_socket or RouteSocket()  # opened at first use
        await self._route_socket.change(index, gone, new)

    def close_routes(self) -> None:
        """Close the route socket (when the device is closed)."""
        if self._route_socket is not None:
            self._route_socket.close()
            self._route_socket = None

    async def routes(self) -> set[str]:
        async with self._lock:
            netns, index = self.netns, self.index
            return await run_netlink(lambda: device_routes(netns, index))

    async def link_state(self) -> LinkState:
        netns, interface = self.netns, self.config.interface
        return await run_netlink(lambda: read_link_state(netns, interface))

    async def _repair_adopted(self, peers: Iterable[DevicePeer]) -> None:
        """An adopted link: only our addresses, and a route per peer exactly."""
        interface, index, netns = self.config.interface, self.index, self.netns
        keep = [str(addr.ip) for addr in self.config.addresses]
        stale = await run_netlink(lambda: prune_addresses(netns, index, keep))
        if stale:
            log.warning("%s: removed addresses of a previous run: %s", interface, ",".join(stale))
        await self._sync_routes(peers)

    async def _settle_routes(self, peers: Iterable[DevicePeer]) -> None:
        """After a change that failed part-way (``_routes_unsure``), the routes made
        exactly the allowed IPs of ``peers``, the device as just read (invariant 9):
        a ``set`` refused or timed out may have put peers on the device whose routes
        were never added, and a pass that finds them there plans nothing for them."""
        if self._routes_unsure:
            await self._sync_routes(peers)
            self._routes_unsure = False

    async def _sync_routes(self, peers: Iterable[DevicePeer]) -> None:
        interface, index, netns = self.config.interface, self.index, self.netns
        held = {str(ip_network(ip, strict=False)) for p in peers for ip in p.allowed_ips}
        bound = NETLINK_TIMEOUT + ROUTE_ALLOWANCE * len(held)  # a repair may add them all
        gone, new = await run_netlink(lambda: sync_peer_routes(netns, index, held), bound)
        if gone or new:
            log.info(
                "%s: peer routes repaired (-%s +%s)",
                interface,
                ",".join(sorted(gone)) or "none",
                ",".join(sorted(new)) or "none",
            )
