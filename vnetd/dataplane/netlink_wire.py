"""Netlink's wire format, the part every hand-packed socket here shares: the message
header, an attribute, a message stream cut into messages, and the route message.

``link_socket`` (the device's set-up), ``route_socket`` (the peers' routes) and
``wg_netlink`` (WireGuard's generic netlink family) pack their requests with
``struct`` instead of pyroute2's codecs, each for a reason its docstring measures;
what they pack is built from these. Pure: no socket, no pyroute2.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x100, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
ATTRIBUTE = struct.Struct("=HH")  # rtattr / nlattr: length, type
U32 = struct.Struct("=I")
ERRNO = struct.Struct("=i")  # the first field of an NLMSG_ERROR payload
TYPE_MASK = 0x3FFF  # an attribute's type without NLA_F_NESTED and NLA_F_NET_BYTEORDER
RTMSG = struct.Struct("=BBBBBBBBI")
"""rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags."""
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4  # what pyroute2's route("add") and route("replace") write


def attribute(kind: int, payload: bytes) -> bytes:
    """One attribute: length, type, the payload padded to 4 bytes."""
    length = ATTRIBUTE.size + len(payload)
    return ATTRIBUTE.pack(length, kind) + payload + bytes(-length % 4)


def message(kind: int, flags: int, sequence: int, body: bytes) -> bytes:
    """A netlink request: the header, then ``body`` (the family header and attributes)."""
    return HEADER.pack(HEADER.size + len(body), kind, flags, sequence, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """``(type, flags, sequence, payload)`` of each netlink message in ``data``."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, flags, sequence, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > len(data):
            break
        yield kind, flags, sequence, data[offset + HEADER.size : offset + length]
        offset += (length + 3) & ~3


def attributes(data: bytes) -> dict[int, bytes]:
    """The attributes of ``data`` by type (flags masked off; the last of a type wins)."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset + ATTRIBUTE.size <= len(data):
        length, kind = ATTRIBUTE.unpack_from(data, offset)
        if length < ATTRIBUTE.size:
            break
        found[kind & TYPE_MASK] = data[offset + ATTRIBUTE.size : offset + length]
        offset += (length + 3) & ~3
    return found
