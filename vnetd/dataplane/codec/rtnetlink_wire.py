"""rtnetlink's requests for the device's link, addresses and routes, packed with
``struct``, and the few answers the writes read back (a route dump, a link's index).

Every write of a link, an address or a route goes through these bytes, sent by
``link_socket`` (one request at a time) or ``route_socket`` (the peers' routes,
windowed). Why not pyroute2's message classes: ``rtmsg.encode`` costs about 0.3 ms
of CPU per message on a pass's cold caches, this about 20 µs; and importing
pyroute2's ``IPRoute`` costs about 35 ms of CPU at start (docs/architecture.md,
"Start-up" and "Data plane and routing"). A unit test compares each request with
the bytes of pyroute2's message class given the same fields (the fields pyroute2's
``IPRoute`` or ``ip`` send for that change). Pure: no socket, no pyroute2.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network

from vnetd.dataplane.codec.netlink_wire import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    U32,
    attribute,
    attributes,
    message,
)

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 4, 18, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NOPREFIXROUTE = 0x200
IFF_UP = 0x1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_TABLE = 1, 4, 5, 6, 8, 15
RTAX_LOCK, RTAX_MTU = 1, 2
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4  # what pyroute2's route("add") and route("replace") write
RT_SCOPE_UNIVERSE, RT_SCOPE_NOWHERE = 0, 255  # NOWHERE on a delete: any scope (``ip route del``)
RTN_UNICAST, RTN_UNREACHABLE = 1, 7
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")
"""rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags."""

ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
"""The flags of a create that fails with EEXIST when the object is there."""

Address = IPv4Interface | IPv6Interface
Network = IPv4Network | IPv6Network


def _family(version: int) -> int:
    return socket.AF_INET6 if version == 6 else socket.AF_INET


def _ifname(name: str) -> bytes:
    return attribute(IFLA_IFNAME, name.encode() + b"\0")


# --- links ------------------------------------------------------------------------------


def new_wireguard_link(name: str, sequence: int) -> bytes:
    """Create a link ``name`` of kind ``wireguard`` (``ip link add NAME type wireguard``)."""
    body = IFINFO.pack(0, 0, 0, 0, 0) + _ifname(name)
    body += attribute(IFLA_LINKINFO, attribute(IFLA_INFO_KIND, b"wireguard\0"))
    return message(RTM_NEWLINK, ADD, sequence, body)


def delete_link(name: str, sequence: int) -> bytes:
    """Delete the link called ``name`` (``ip link del NAME``)."""
    body = IFINFO.pack(0, 0, 0, 0, 0) + _ifname(name)
    return message(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, sequence, body)


def get_link(name: str, sequence: int) -> bytes:
    """Ask for the link called ``name``: the answer is one RTM_NEWLINK, or ENODEV."""
    body = IFINFO.pack(0, 0, 0, 0, 0) + _ifname(name)
    return message(RTM_GETLINK, NLM_F_REQUEST, sequence, body)


def link_index(payload: bytes) -> int:
    """The index of the link an RTM_NEWLINK message describes."""
    index: int = IFINFO.unpack_from(payload)[2]
    return index


def link_up(index: int, mtu: int, sequence: int) -> bytes:
    """The link's MTU, and up (``ip link set dev X mtu M up``)."""
    body = IFINFO.pack(0, 0, index, IFF_UP, IFF_UP) + attribute(IFLA_MTU, U32.pack(mtu))
    return message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, sequence, body)


# --- addresses --------------------------------------------------------------------------


def _address(index: int, addr: Address, prefixlen: int, flags: int) -> bytes:
    family = _family(addr.version)
    packed = addr.ip.packed
    body = IFADDR.pack(family, prefixlen, flags & 0xFF, 0, index)
    if family == socket.AF_INET:
        body += attribute(IFA_LOCAL, packed)
    body += attribute(IFA_ADDRESS, packed)
    if flags:
        body += attribute(IFA_FLAGS, U32.pack(flags))
    return body


def new_address(index: int, addr: Address, prefixlen: int, flags: int, sequence: int) -> bytes:
    """Add ``addr`` with ``prefixlen`` and the address ``flags`` (IFA_FLAGS) to the link."""
    return message(RTM_NEWADDR, ADD, sequence, _address(index, addr, prefixlen, flags))


def delete_address(index: int, addr: Address, prefixlen: int, sequence: int) -> bytes:
    """Delete ``addr``/``prefixlen`` from the link (``ip addr del``)."""
    body = _address(index, addr, prefixlen, 0)
    return message(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, sequence, body)


# --- routes -----------------------------------------------------------------------------


def unreachable_route(network: Network, sequence: int) -> bytes:
    """Route ``network`` ``unreachable`` in the main table, over any route to exactly it
    (``ip route replace unreachable NETWORK``)."""
    body = RTMSG.pack(_family(network.version), network.prefixlen, 0, 0, RT_TABLE_MAIN,
                      RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNREACHABLE, 0)  # fmt: skip
    body += attribute(RTA_TABLE, U32.pack(RT_TABLE_MAIN))
    body += attribute(RTA_DST, network.network_address.packed)
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    return message(RTM_NEWROUTE, flags, sequence, body)


def _destination(dst: str) -> tuple[int, bytes, int]:
    """(family, packed address, prefix length) of a CIDR (a bare address: a host)."""
    address, _, prefix = dst.partition("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    packed = socket.inet_pton(family, address)
    return family, packed, int(prefix) if prefix else 8 * len(packed)


def route_message(kind: str, dst: str, oif: int, sequence: int) -> bytes:
    """The request that adds (``kind`` "add") or deletes ("del") the route to ``dst``
    (a CIDR) via the link ``oif`` in the main table: an add with the fields pyroute2's
    ``route("add", dst=, oif=)`` sends, a delete with those of ``ip route del``."""
    family, packed, prefixlen = _destination(dst)
    if kind == "add":
        kind_flags = (RTM_NEWROUTE, ADD)
        proto, scope, rtype = RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST
    else:
        kind_flags = (RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK)
        proto, scope, rtype = 0, RT_SCOPE_NOWHERE, 0
    body = RTMSG.pack(family, prefixlen, 0, 0, RT_TABLE_MAIN, proto, scope, rtype, 0)
    body += attribute(RTA_TABLE, U32.pack(RT_TABLE_MAIN))
    body += attribute(RTA_DST, packed)
    body += attribute(RTA_OIF, U32.pack(oif))
    return message(*kind_flags, sequence, body)


def mtu_lock_route(dst: str, oif: int, mtu: int, sequence: int) -> bytes:
    """Change the route to ``dst`` via ``oif`` to carry ``mtu lock MTU`` (``ip route change
    DST dev X proto static mtu lock MTU``): NLM_F_REPLACE without NLM_F_CREATE, so a
    route that is not there is not made (ENOENT). The fields of pyroute2's
    ``route("change", dst=, oif=, proto=, metrics={"mtu": , "lock": })``."""
    family, packed, prefixlen = _destination(dst)
    body = RTMSG.pack(family, prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC,
                      RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)  # fmt: skip
    body += attribute(RTA_DST, packed) + attribute(RTA_OIF, U32.pack(oif))
    metrics = attribute(RTAX_MTU, U32.pack(mtu)) + attribute(RTAX_LOCK, U32.pack(1 << RTAX_MTU))
    body += attribute(RTA_METRICS, metrics)  # no NLA_F_NESTED: as pyroute2 and ip send it
    return message(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE, sequence, body)


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
