"""What the host tells about the device's link and its underlay, read through pyroute2:
a link's kind and state, the routes to the device, the link's addresses, the
underlay's MTU and the default route's address.

These are dumps and reads, where pyroute2 is the better tool: it decodes every
attribute of a dump into a message the code can ask by name, and none of them is
on the start's path in the daemon's own namespace (``existing_link_kind`` answers
a fresh pod without netlink). Every write of a link, an address or a route goes
over ``link_socket`` or ``route_socket`` instead (docs/architecture.md, "Data plane
and routing").

pyroute2's calls are sync; ``run_netlink`` runs a batch of them in a worker thread
with a timeout, never on the event loop, and ``IPRoute`` is imported at its first
use (docs/architecture.md, "Start-up"). The two reads ``vnetd up`` makes before the
event loop exists (``default_route_address``, ``resolve_mtu``) are bounded the same
way by ``read_before_start``: a daemon thread joined with a timeout, by hand
because ``concurrent.futures``' workers are joined at interpreter exit, so a read
the kernel never answers would hold the process after its error; and a
``NetlinkError`` (not an ``OSError``) becomes one line naming the read and the fix.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from ipaddress import ip_address, ip_network
from typing import TYPE_CHECKING, TypeVar

import trio

from vnetd.dataplane.base import LinkState
from vnetd.dataplane.codec.rtnetlink_wire import IFF_UP, RT_TABLE_MAIN, RTN_UNICAST
from vnetd.dataplane.rtnetlink.pyroute2_package import NetlinkError
from vnetd.errors import DataplaneError, VnetdError
from vnetd.spec import MeshSpec

if TYPE_CHECKING:
    from vnetd.dataplane.rtnetlink.pyroute2_package import IPRoute

daemon_log = logging.getLogger("vnetd.daemon")
"""The logger of the host probes' lines, as when the daemon made them (JSON logs name it)."""

NETLINK_TIMEOUT = 5.0  # one batch of netlink calls
ROUTE_ALLOWANCE = 0.05
"""s more per route a read or dump may meet (1000 missed 5 s in the guest)."""

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


def read_before_start(fn: Callable[[], T], what: str, fix: str, timeout: float | None = None) -> T:
    """``fn()``, a sync netlink read made before the event loop starts, bounded by
    ``timeout`` seconds (None: ``NETLINK_TIMEOUT``). pyroute2's ``IPRoute`` is
    imported first, outside the bound, as ``run_netlink`` does: the bound is for the
    kernel's answer.

    Args:
        what: the input being read, for the message (``mesh.mtu: auto: the
            underlay's MTU``).
        fix: what the user can do instead (``set mesh.mtu to a number``).

    Raises:
        VnetdError: netlink refused the read, failed, or gave no answer in time;
            ``fn``'s own ``VnetdError`` as it is.
    """
    done: list[T] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            done.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    if "pyroute2.iproute.linux" not in sys.modules:
        _import_iproute()
    worker = threading.Thread(target=read, name=f"netlink read: {what}", daemon=True)
    timeout = NETLINK_TIMEOUT if timeout is None else timeout
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise VnetdError(f"{what}: no answer from netlink within {timeout:g} s; {fix}")
    if failed:
        exc = failed[0]
        if isinstance(exc, VnetdError):
            raise exc
        if isinstance(exc, NetlinkError | OSError):
            raise VnetdError(f"{what}: cannot read it: {_netlink_text(exc)}; {fix}") from None
        raise exc
    return done[0]


def _netlink_text(exc: BaseException) -> str:
    """A netlink failure in words: pyroute2's ``NetlinkError`` prints as a tuple."""
    code = getattr(exc, "code", None) if isinstance(exc, NetlinkError) else None
    if isinstance(code, int) and code > 0:
        return f"netlink error {code} ({os.strerror(code)})"
    return str(getattr(exc, "strerror", None) or exc)


def _import_iproute() -> None:
    from vnetd.dataplane.rtnetlink.pyroute2_package import IPRoute  # noqa: F401 (imported for later)


def _iproute(netns: str | None) -> IPRoute:
    from vnetd.dataplane.rtnetlink.pyroute2_package import IPRoute  # at first use: the module doc

    # flags=0: never create the namespace (pyroute2's default is O_CREAT).
    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


async def existing_link_kind(netns: str | None, name: str) -> str | None:
    """``link_kind`` in a thread; in our own namespace, None without netlink when no
    link has that name (a fresh pod)."""
    if netns is None:
        try:
            socket.if_nametoindex(name)
        except OSError:
            return None
    return await run_netlink(lambda: link_kind(netns, name))


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


def link_addresses(netns: str | None, index: int) -> list[tuple[str, int]]:
    """The link's addresses, as (address, prefix length)."""
    with _iproute(netns) as ipr:
        return [(str(msg.get("IFA_ADDRESS")), int(msg["prefixlen"]))
                for msg in ipr.get_addr(index=index) if msg.get("IFA_ADDRESS")]  # fmt: skip


def device_routes(netns: str | None, index: int) -> set[str]:
    """Destinations routed to the device in the main table (CIDR strings)."""
    found: set[str] = set()
    with _iproute(netns) as ipr:
        for route in ipr.get_routes():
            if (
                route.get("oif") != index
                or route.get("table") != RT_TABLE_MAIN
                or route["type"] != RTN_UNICAST
            ):
                continue
            default = "0.0.0.0" if route["family"] == 2 else "::"
            net = ip_network(f"{route.get('dst') or default}/{route['dst_len']}")
            if not net.is_link_local:
                found.add(str(net))
    return found


def read_link_state(netns: str | None, interface: str) -> LinkState:
    """The link's existence, IFF_UP flag and addresses (sync; use ``run_netlink``)."""
    with _iproute(netns) as ipr:
        found = ipr.link_lookup(ifname=interface)
        if not found:
            return LinkState(False)
        index = found[0]
        link = ipr.get_links(index)[0]
        addresses = frozenset(str(msg.get_attr("IFA_ADDRESS")) for msg in ipr.get_addr(index=index))
        return LinkState(True, bool(link["flags"] & IFF_UP), addresses)


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
    ifname, underlay = read_before_start(
        lambda: underlay_mtu(netns, host), "mesh.mtu: auto: the underlay's MTU",
        "set mesh.mtu to a number",
    )  # fmt: skip
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
    """The first address of the interface that holds the IPv4 (else IPv6) default route,
    read before the event loop starts (``read_before_start``).

    Raises:
        VnetdError: netlink failed or gave no answer in time.
    """
    return read_before_start(
        _default_route_address, "the endpoint: the default route's address",
        "give --endpoint HOST:PORT or set POD_IP",
    )  # fmt: skip


def _default_route_address() -> str | None:
    with _iproute(None) as ipr:
        for family in (socket.AF_INET, socket.AF_INET6):
            for route in ipr.get_default_routes(family=family):
                oif = route.get("RTA_OIF")
                for addr in ipr.get_addr(family=family, index=oif):
                    value = addr.get("IFA_ADDRESS")
                    if value:
                        return str(value)
    return None
