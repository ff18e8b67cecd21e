"""The link, address and route requests ``vnetd.dataplane.rtnetlink.link_socket`` sends (packed
by ``rtnetlink_wire``): the bytes of pyroute2's message classes given the same fields,
and the dumps and answers read."""

from __future__ import annotations

import socket
import struct
from ipaddress import ip_interface, ip_network

import pytest

from vnetd.dataplane.codec.netlink_wire import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    attribute,
    messages,
)
from vnetd.dataplane.codec.rtnetlink_wire import (
    IFA_F_NOPREFIXROUTE,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_GETLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    Route,
    delete_address,
    delete_link,
    get_link,
    link_index,
    link_up,
    mtu_lock_route,
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


@pytest.mark.parametrize(
    ("addr", "prefixlen"),
    [
        pytest.param("10.250.0.7/16", 16, id="v4"),
        pytest.param("10.250.0.7/32", 32, id="v4-host"),
        pytest.param("fd00:250::7/64", 64, id="v6"),
    ],
)
def test_address_delete_is_pyroute2s_bytes(addr: str, prefixlen: int) -> None:
    interface = ip_interface(addr)
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6 if interface.version == 6 else socket.AF_INET
    msg["prefixlen"], msg["index"] = prefixlen, 9
    attrs = [("IFA_LOCAL", str(interface.ip))] if interface.version == 4 else []
    msg["attrs"] = [*attrs, ("IFA_ADDRESS", str(interface.ip))]
    expected = encoded(msg, RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, 6)
    assert delete_address(9, interface, prefixlen, 6) == expected


def test_link_delete_is_pyroute2s_bytes() -> None:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", "vnet0")]
    assert delete_link("vnet0", 4) == encoded(msg, RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, 4)


def test_link_lookup_is_pyroute2s_bytes_and_its_answer_read() -> None:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", "vnet0")]
    assert get_link("vnet0", 5) == encoded(msg, RTM_GETLINK, NLM_F_REQUEST, 5)
    answer = ifinfmsg()
    answer["index"], answer["flags"] = 12, 1
    answer["attrs"] = [("IFLA_IFNAME", "vnet0"), ("IFLA_MTU", 1420)]
    [(kind, _, _, payload)] = list(messages(encoded(answer, RTM_NEWLINK, 0, 5)))
    assert (kind, link_index(payload)) == (RTM_NEWLINK, 12)


@pytest.mark.parametrize(
    ("dst", "oif", "mtu"),
    [("10.250.0.7/32", 3, 1200), ("fd00:250::7/128", 300, 1280)],
)
def test_route_mtu_lock_is_pyroute2s_bytes(dst: str, oif: int, mtu: int) -> None:
    """The fields pyroute2's ``route("change", dst=, oif=, proto=4, metrics={"mtu": ,
    "lock": 1 << RTAX_MTU})`` sent (read with strace): no RTA_TABLE, a change only."""
    address, _, prefix = dst.partition("/")
    msg = rtmsg()
    msg["family"] = socket.AF_INET6 if ":" in address else socket.AF_INET
    msg["dst_len"], msg["table"], msg["proto"], msg["type"] = int(prefix), 254, 4, 1
    metrics = {"attrs": [("RTAX_MTU", mtu), ("RTAX_LOCK", 4)]}
    msg["attrs"] = [("RTA_DST", address), ("RTA_OIF", oif), ("RTA_METRICS", metrics)]
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE
    assert mtu_lock_route(dst, oif, mtu, 9) == encoded(msg, RTM_NEWROUTE, flags, 9)


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
