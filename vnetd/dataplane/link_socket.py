"""The device's set-up in the daemon's own network namespace, over one trio netlink socket.

What a launcher waits on is the rank's address on the link, and pyroute2's
``IPRoute`` is the costliest thing on that path: its modules (an asyncio core,
traffic-control and mock modules among them) take about 35 ms of CPU to import,
and each ``IPRoute`` opened in a worker thread more (docs/architecture.md,
"Start-up"). The set-up is a handful of fixed requests, so they are packed here
with ``struct`` (``netlink_wire``), as ``route_socket`` packs the peers' routes, and sent from the
event loop: the probe that asks whether the kernel can make a WireGuard link
(``wireguard_link_refused``), the address (``add_address``), MTU and up
(``set_link_up``), the routes to the overlay network (``routes_to``, a dump) and
its ``unreachable`` route (``route_unreachable``). A unit test compares each
request with the bytes of pyroute2's message classes given the same fields; a
contract test runs them in a namespace of its own against the kernel. Another
namespace (the tests' devices), an adopted link and every read stay with
pyroute2 (``vnetd.dataplane.link``).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network

import trio

from vnetd.dataplane.netlink_wire import (
    ERRNO,
    HEADER,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    RT_TABLE_MAIN,
    RTA_DST,
    RTA_GATEWAY,
    RTA_OIF,
    RTA_PRIORITY,
    RTA_TABLE,
    RTMSG,
    RTPROT_STATIC,
    U32,
    attribute,
    attributes,
    message,
    messages,
)
from vnetd.errors import DataplaneError

LINK_TIMEOUT = 5.0  # one request and its answer, a dump included (invariant 8)
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_NEWROUTE, RTM_GETROUTE = 16, 17, 20, 24, 26
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 4, 18, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NOPREFIXROUTE = 0x200
RTN_UNREACHABLE = 7
IFF_UP = 0x1
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index


def new_wireguard_link(name: str, sequence: int) -> bytes:
    """Create a link ``name`` of kind ``wireguard`` (``ip link add NAME type wireguard``)."""
    info = attribute(IFLA_INFO_KIND, b"wireguard\0")
    body = _IFINFO.pack(0, 0, 0, 0, 0) + attribute(IFLA_IFNAME, name.encode() + b"\0")
    body += attribute(IFLA_LINKINFO, info)
    return message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                   sequence, body)  # fmt: skip


def delete_link(index: int, sequence: int) -> bytes:
    return message(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, sequence,
                   _IFINFO.pack(0, 0, index, 0, 0))  # fmt: skip


def link_up(index: int, mtu: int, sequence: int) -> bytes:
    """The link's MTU, and up (``ip link set dev X mtu M up``)."""
    body = _IFINFO.pack(0, 0, index, IFF_UP, IFF_UP) + attribute(IFLA_MTU, U32.pack(mtu))
    return message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, sequence, body)


def new_address(
    index: int, addr: IPv4Interface | IPv6Interface, prefixlen: int, flags: int, sequence: int
) -> bytes:
    """Add ``addr`` with ``prefixlen`` and the address ``flags`` (IFA_FLAGS) to the link."""
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    packed = addr.ip.packed
    body = _IFADDR.pack(family, prefixlen, flags & 0xFF, 0, index)
    if family == socket.AF_INET:
        body += attribute(IFA_LOCAL, packed)
    body += attribute(IFA_ADDRESS, packed)
    if flags:
        body += attribute(IFA_FLAGS, U32.pack(flags))
    return message(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                   sequence, body)  # fmt: skip


def unreachable_route(network: IPv4Network | IPv6Network, sequence: int) -> bytes:
    """Route ``network`` ``unreachable`` in the main table, over any route to exactly it
    (``ip route replace unreachable NETWORK``)."""
    family = socket.AF_INET6 if network.version == 6 else socket.AF_INET
    body = RTMSG.pack(family, network.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, 0,
                       RTN_UNREACHABLE, 0)  # fmt: skip
    body += attribute(RTA_TABLE, U32.pack(RT_TABLE_MAIN))
    body += attribute(RTA_DST, network.network_address.packed)
    return message(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                   sequence, body)  # fmt: skip


def route_dump(family: int, sequence: int) -> bytes:
    return message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, sequence,
                   RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0))  # fmt: skip


@dataclass(frozen=True)
class Route:
    """What a route dump says of one route (for the one line about a route replaced)."""

    family: int
    dst: str | None
    dst_len: int
    table: int
    type: int
    gateway: str | None
    oif: int | None
    priority: int


def parse_route(payload: bytes) -> Route:
    """One RTM_NEWROUTE message of a dump."""
    family, dst_len, _, _, table, _, _, kind, _ = RTMSG.unpack_from(payload)
    attrs = attributes(payload[RTMSG.size :])

    def address(key: int) -> str | None:
        value = attrs.get(key)
        return socket.inet_ntop(family, value) if value else None

    def number(key: int) -> int | None:
        value = attrs.get(key)
        return U32.unpack(value[:4])[0] if value and len(value) >= 4 else None

    return Route(family, address(RTA_DST), dst_len, number(RTA_TABLE) or table, kind,
                 address(RTA_GATEWAY), number(RTA_OIF), number(RTA_PRIORITY) or 0)  # fmt: skip


class LinkSocket:
    """One ``NETLINK_ROUTE`` request socket in the daemon's namespace; a context manager.

    Each call sends one request and waits, at most ``timeout`` s, for its answer.
    """

    def __init__(self, timeout: float = LINK_TIMEOUT) -> None:
        self.timeout = timeout
        self._socket = trio.socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sequence = 0

    def __enter__(self) -> LinkSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._socket.close()

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    async def request(self, data: bytes, what: str) -> int:
        """Send one request; the errno of its acknowledgement (0: done).

        Raises:
            DataplaneError: no answer within ``timeout`` s, or the socket failed.
        """
        sequence = HEADER.unpack_from(data)[3]
        for kind, _, seq, payload in await self._exchange(data, what, NLMSG_ERROR):
            if kind == NLMSG_ERROR and seq == sequence:
                code: int = -ERRNO.unpack_from(payload)[0]
                return code
        raise AssertionError("unreachable: _exchange returns at the acknowledgement")

    async def dump(self, data: bytes, what: str) -> list[bytes]:
        """Send one dump request; the payloads of its messages, up to NLMSG_DONE.

        Raises:
            DataplaneError: the kernel refused, gave no answer in time, or the socket failed.
        """
        found: list[bytes] = []
        for kind, _, _, payload in await self._exchange(data, what, NLMSG_DONE):
            if kind == NLMSG_ERROR:
                code = -ERRNO.unpack_from(payload)[0]
                raise DataplaneError(f"netlink: {what}: {os.strerror(code)}")
            if kind != NLMSG_DONE:
                found.append(payload)
        return found

    async def _exchange(
        self, data: bytes, what: str, last: int
    ) -> list[tuple[int, int, int, bytes]]:
        """Send ``data``; the messages answering it, up to the first of type ``last``
        or an error."""
        sequence = HEADER.unpack_from(data)[3]
        answers: list[tuple[int, int, int, bytes]] = []
        try:
            with trio.fail_after(self.timeout):
                await self._socket.send(data)
                while True:
                    for item in messages(await self._socket.recv(65536)):
                        if item[2] != sequence:
                            continue
                        answers.append(item)
                        if item[0] in (last, NLMSG_ERROR):
                            return answers
        except trio.TooSlowError:
            raise DataplaneError(f"netlink: {what}: no answer within {self.timeout:g} s") from None
        except OSError as exc:
            raise DataplaneError(f"netlink: {what}: {exc.strerror or exc}") from exc

    async def wireguard_link_refused(self, name: str) -> str | None:
        """Why a WireGuard link cannot be created here, or None when it can: creates
        ``name`` and deletes it again at once."""
        code = await self.request(new_wireguard_link(name, self._next()), "wireguard link")
        if code:
            hint = " (no wireguard kernel module)" if code == errno.EOPNOTSUPP else ""
            return f"creating a wireguard link: {os.strerror(code)}{hint}"
        index = socket.if_nametoindex(name)
        code = await self.request(delete_link(index, self._next()), "link delete")
        if code not in (0, errno.ENODEV):
            raise DataplaneError(f"netlink: deleting the probe link {name}: {os.strerror(code)}")
        return None

    async def add_address(
        self, index: int, addr: IPv4Interface | IPv6Interface, prefixlen: int, flags: int
    ) -> int:
        """Add ``addr`` to the link; the errno (EEXIST: it was there)."""
        request = new_address(index, addr, prefixlen, flags, self._next())
        return await self.request(request, f"address {addr.ip}/{prefixlen}")

    async def set_link_up(self, index: int, mtu: int) -> None:
        code = await self.request(link_up(index, mtu, self._next()), "link up")
        if code:
            raise DataplaneError(f"netlink: link mtu {mtu} up: {os.strerror(code)}")

    async def routes_to(self, network: IPv4Network | IPv6Network) -> list[Route]:
        """The main table's routes to exactly ``network``."""
        family = socket.AF_INET6 if network.version == 6 else socket.AF_INET
        found = []
        for payload in await self.dump(route_dump(family, self._next()), "route dump"):
            route = parse_route(payload)
            if (route.dst, route.dst_len, route.table) == (
                str(network.network_address), network.prefixlen, RT_TABLE_MAIN):  # fmt: skip
                found.append(route)
        return found

    async def route_unreachable(self, network: IPv4Network | IPv6Network) -> None:
        code = await self.request(unreachable_route(network, self._next()), "route replace")
        if code:
            raise DataplaneError(f"netlink: route unreachable {network}: {os.strerror(code)}")
