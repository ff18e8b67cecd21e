"""The peer-route requests ``vnetd.dataplane.rtnetlink.route_socket`` sends (packed by
``rtnetlink_wire``): the same bytes as pyroute2's ``rtmsg`` with the same fields, and
the kernel's acknowledgements read (``netlink_wire``)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from vnetd.dataplane.codec.netlink_wire import acknowledgements
from vnetd.dataplane.codec.rtnetlink_wire import route_message

from pyroute2.netlink import (  # isort: skip (after vnetd's pyroute2 deferral)
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_ERROR,
)
from pyroute2.netlink.rtnl import RTM_DELROUTE, RTM_NEWROUTE  # isort: skip
from pyroute2.netlink.rtnl.rtmsg import rtmsg  # isort: skip


def pyroute2_message(kind: str, dst: str, oif: int, sequence: int) -> bytes:
    """The request encoded by pyroute2: an add with the fields of its ``route("add")``
    (proto static, scope universe, unicast, main table), a delete with ``ip route del``'s."""
    address, _, prefix = dst.partition("/")
    msg = rtmsg()
    msg["family"] = socket.AF_INET6 if ":" in address else socket.AF_INET
    msg["dst_len"] = int(prefix)
    msg["table"] = 254
    if kind == "add":
        msg["proto"], msg["scope"], msg["type"] = 4, 0, 1
        msg["header"]["type"] = RTM_NEWROUTE
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    else:
        msg["scope"] = 255
        msg["header"]["type"] = RTM_DELROUTE
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = sequence
    msg["attrs"] = [("RTA_TABLE", 254), ("RTA_DST", address), ("RTA_OIF", oif)]
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize(
    ("kind", "dst", "oif", "sequence"),
    [
        ("add", "10.250.0.7/32", 7, 1),
        ("del", "10.250.0.7/32", 7, 2),
        ("add", "fd00:250::7/128", 300, 3),
        ("del", "fd00:250::/64", 3, 0x7FFFFFFF),
    ],
)
def test_requests_are_pyroute2s_bytes(kind: str, dst: str, oif: int, sequence: int) -> None:
    assert route_message(kind, dst, oif, sequence) == pyroute2_message(kind, dst, oif, sequence)


def ack(sequence: int, code: int) -> bytes:
    """An NLMSG_ERROR message (``code`` 0: done) echoing a 20-byte request."""
    body = struct.pack("=i", -code) + bytes(20)
    return struct.pack("=IHHII", 16 + len(body), NLMSG_ERROR, 0, sequence, 0) + body


def test_acknowledgements_give_each_sequence_and_errno() -> None:
    data = ack(1, 0) + ack(2, errno.EEXIST) + ack(3, errno.ENODEV)
    assert list(acknowledgements(data)) == [(1, 0), (2, errno.EEXIST), (3, errno.ENODEV)]
    assert list(acknowledgements(data[:10])) == []
