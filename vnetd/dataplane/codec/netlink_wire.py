"""Netlink's wire format, the part every hand-packed socket here shares: the message
header and its flags, an attribute, and the one walker over messages and attributes.

``rtnetlink_wire`` (links, addresses, routes) and ``wg_netlink`` (WireGuard's
generic netlink family) pack their requests with ``struct`` instead of pyroute2's
codecs, each for a reason its docstring measures; what they pack is built from
these, and what they read is cut by ``message_spans`` and ``attribute_spans``.
Pure: no socket, no pyroute2.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x100, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED = 0x8000
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
ATTRIBUTE = struct.Struct("=HH")  # rtattr / nlattr: length, type
U32 = struct.Struct("=I")
ERRNO = struct.Struct("=i")  # the first field of an NLMSG_ERROR payload
TYPE_MASK = 0x3FFF  # an attribute's type without NLA_F_NESTED and NLA_F_NET_BYTEORDER


def attribute(kind: int, payload: bytes) -> bytes:
    """One attribute: length, type, the payload padded to 4 bytes."""
    length = ATTRIBUTE.size + len(payload)
    return ATTRIBUTE.pack(length, kind) + payload + bytes(-length % 4)


def nested(kind: int, parts: Iterable[bytes]) -> bytes:
    """An attribute holding the attributes ``parts`` (NLA_F_NESTED set)."""
    return attribute(kind | NLA_F_NESTED, b"".join(parts))


def message(kind: int, flags: int, sequence: int, body: bytes) -> bytes:
    """A netlink request: the header, then ``body`` (the family header and attributes)."""
    return HEADER.pack(HEADER.size + len(body), kind, flags, sequence, 0) + body


def message_spans(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """``(type, flags, sequence, start, end)`` of each netlink message in ``data``, its
    payload being ``data[start:end]``; a truncated last message is left out."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, flags, sequence, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > len(data):
            return
        yield kind, flags, sequence, offset + HEADER.size, offset + length
        offset += (length + 3) & ~3


def attribute_spans(data: bytes, offset: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(type, start, end)`` of each attribute in ``data[offset:end]`` (type flags masked
    off), its payload being ``data[start:end]``."""
    while offset + ATTRIBUTE.size <= end:
        length, kind = ATTRIBUTE.unpack_from(data, offset)
        if length < ATTRIBUTE.size:
            return
        yield kind & TYPE_MASK, offset + ATTRIBUTE.size, offset + length
        offset += (length + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """``(type, flags, sequence, payload)`` of each netlink message in ``data``."""
    for kind, flags, sequence, start, end in message_spans(data):
        yield kind, flags, sequence, data[start:end]


def attributes(data: bytes) -> dict[int, bytes]:
    """The attributes of ``data`` by type (flags masked off; the last of a type wins)."""
    return {kind: data[start:end] for kind, start, end in attribute_spans(data, 0, len(data))}


def acknowledgements(data: bytes) -> Iterator[tuple[int, int]]:
    """``(sequence, errno)`` of each NLMSG_ERROR message in ``data`` (errno 0: done)."""
    for kind, _, sequence, start, _ in message_spans(data):
        if kind == NLMSG_ERROR:
            yield sequence, -ERRNO.unpack_from(data, start)[0]
