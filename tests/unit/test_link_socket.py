"""The set-up requests of ``vnetd.dataplane.link_socket``: the bytes of pyroute2's
message classes given the same fields, and the dumps and acknowledgements read."""

from __future__ import annotations

import socket
import struct
from ipaddress import ip_interface, ip_network

import pytest

from vnetd.dataplane.link_socket import (
    IFA_F_NOPREFIXROUTE,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    Route,
    attribute,
    link_up,
    messages,
    new_address,
    new_wireguard_link,
    parse_route,
    unreachable_route,
)

from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # isort: skip (after the deferral)
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # isort: skip
from pyroute2.netlink.rtnl.rtmsg import rtmsg  # isort: skip

ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL


def encoded(msg: ifaddrmsg | ifinfmsg | rtmsg, kind: int, flags: int, sequence: int) -> bytes:
    msg["header"]["type"], msg["header"]["flags"] = kind, flags
    msg["header"]["sequence_number"] = sequence
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize(
    ("addr", "prefixlen", "flags"),
    [
        pytest.param("10.250.0.7/16", 16, IFA_F_NOPREFIXROUTE, id="v4-noprefixroute"),
        pytest.param("10.250.0.7/16", 32, 0, id="v4-host"),
        pytest.param("fd00:250::7/64", 64, IFA_F_NOPREFIXROUTE, id="v6-noprefixroute"),
    ],
)
def test_address_is_pyroute2s_bytes(addr: str, prefixlen: int, flags: int) -> None:
    interface = ip_interface(addr)
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6 if interface.version == 6 else socket.AF_INET
    msg["prefixlen"], msg["flags"], msg["index"] = prefixlen, flags & 0xFF, 9
    attrs = [("IFA_LOCAL", str(interface.ip))] if interface.version == 4 else []
    attrs.append(("IFA_ADDRESS", str(interface.ip)))
    if flags:
        attrs.append(("IFA_FLAGS", flags))
    msg["attrs"] = attrs
    assert new_address(9, interface, prefixlen, flags, 5) == encoded(msg, RTM_NEWADDR, ADD, 5)


def test_link_up_is_pyroute2s_bytes() -> None:
    msg = ifinfmsg()
    msg["index"], msg["flags"], msg["change"] = 4, 1, 1
    msg["attrs"] = [("IFLA_MTU", 1420)]
    assert link_up(4, 1420, 2) == encoded(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 2)


def test_wireguard_link_is_pyroute2s_bytes() -> None:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", "probe7"),
                    ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "wireguard")]})]  # fmt: skip
    assert new_wireguard_link("probe7", 3) == encoded(msg, RTM_NEWLINK, ADD, 3)


@pytest.mark.parametrize("network", ["10.250.0.0/16", "fd00:250::/64"])
def test_unreachable_route_is_pyroute2s_bytes(network: str) -> None:
    net = ip_network(network)
    msg = rtmsg()
    msg["family"] = socket.AF_INET6 if net.version == 6 else socket.AF_INET
    msg["dst_len"], msg["table"], msg["proto"], msg["type"] = net.prefixlen, 254, 4, 7
    msg["attrs"] = [("RTA_TABLE", 254), ("RTA_DST", str(net.network_address))]
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    assert unreachable_route(net, 8) == encoded(msg, RTM_NEWROUTE, flags, 8)


def test_a_dumped_route_is_read() -> None:
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 16, 0, 0, 254, 4, 0, 1, 0)
    body += attribute(15, struct.pack("=I", 254)) + attribute(1, bytes([10, 250, 0, 0]))
    body += attribute(5, bytes([198, 18, 0, 1])) + attribute(4, struct.pack("=I", 3))
    data = struct.pack("=IHHII", 16 + len(body), RTM_NEWROUTE, 2, 7, 0) + body
    [(kind, _, sequence, payload)] = list(messages(data + data[:10]))
    assert (kind, sequence) == (RTM_NEWROUTE, 7)
    assert parse_route(payload) == Route(socket.AF_INET, "10.250.0.0", 16, 254, 1,
                                         "198.18.0.1", 3, 0)  # fmt: skip
