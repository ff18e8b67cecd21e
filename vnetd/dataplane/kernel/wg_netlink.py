"""WireGuard's generic netlink family: many peers per ``WG_CMD_SET_DEVICE``, dumps read
by walking their attributes, over one plain netlink socket per batch.

Why by hand, and not pyroute2's ``WireGuard`` socket (measured in the TCG kernel
guest, 1000 peers on the device): pyroute2's ``set`` takes one peer per message
and encodes it at about 0.9 ms of CPU on a host (an add took 27 ms in the guest,
1000 adds 27 s, 1000 removals 36 s); its dump of 1000 peers took 16 s of CPU, and
one endpoint change 110 ms, most of it a new socket with its own asyncio loop and
the family lookup. WireGuard's kernel side takes any number of peers in one set
(``nla_for_each_nested`` over ``WGDEVICE_A_PEERS`` in its netlink.c, each applied
in order, the first refused one ending the message), so ``set_requests`` packs
them, split into messages of at most ``CHUNK`` bytes (``wg`` itself splits at
its socket buffer), with ``struct``: the bytes of pyroute2's ``wgmsg`` for the
same peers (a unit test decodes them with it and compares). pyroute2 still
provides WireGuard's and generic netlink's constants and, for a network namespace
other than ours (tests), the socket (``netns.create_socket``).

``parse_dump`` reads a ``WG_CMD_GET_DEVICE`` dump by walking its attributes with
``netlink_wire``'s walker (a unit test parses dumps encoded by pyroute2's
``wgmsg``), where pyroute2's decoder took 16 ms of CPU a peer in the guest.
"""

from __future__ import annotations

import base64
import errno
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from ipaddress import ip_address, ip_network
from typing import Any

from vnetd.dataplane.codec.netlink_wire import (
    ATTRIBUTE,
    ERRNO,
    HEADER,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    U32,
    attribute,
    attribute_spans,
    message_spans,
    nested,
)
from vnetd.dataplane.rtnetlink.pyroute2_package import NetlinkError, defer_package_init
from vnetd.model import DevicePeer

defer_package_init()

from pyroute2.netlink.generic import CTRL_CMD_GETFAMILY, GENL_ID_CTRL  # noqa: E402 (deferral)
from pyroute2.netlink.generic.wireguard import (  # noqa: E402
    WG_CMD_GET_DEVICE,
    WG_CMD_SET_DEVICE,
    WG_GENL_NAME,
    WG_GENL_VERSION,
    WGALLOWEDIP_A_CIDR_MASK,
    WGALLOWEDIP_A_FAMILY,
    WGALLOWEDIP_A_IPADDR,
    WGDEVICE_A_IFNAME,
    WGDEVICE_A_LISTEN_PORT,
    WGDEVICE_A_PEERS,
    WGDEVICE_A_PRIVATE_KEY,
    WGPEER_F_REMOVE_ME,
    WGPEER_F_REPLACE_ALLOWEDIPS,
    WGPEER_F_UPDATE_ONLY,
    wgmsg,
)

# pyroute2 numbers the peer attributes only in its decoder's map (their index there).
_PEER_ATTR = {name: index for index, (name, _) in enumerate(wgmsg.wgdevice_peer.nla_map)}
WGPEER_A_PUBLIC_KEY = _PEER_ATTR["WGPEER_A_PUBLIC_KEY"]
WGPEER_A_PRESHARED_KEY = _PEER_ATTR["WGPEER_A_PRESHARED_KEY"]
WGPEER_A_FLAGS = _PEER_ATTR["WGPEER_A_FLAGS"]
WGPEER_A_ENDPOINT = _PEER_ATTR["WGPEER_A_ENDPOINT"]
WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL = _PEER_ATTR["WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL"]
WGPEER_A_LAST_HANDSHAKE_TIME = _PEER_ATTR["WGPEER_A_LAST_HANDSHAKE_TIME"]
WGPEER_A_RX_BYTES = _PEER_ATTR["WGPEER_A_RX_BYTES"]
WGPEER_A_TX_BYTES = _PEER_ATTR["WGPEER_A_TX_BYTES"]
WGPEER_A_ALLOWEDIPS = _PEER_ATTR["WGPEER_A_ALLOWEDIPS"]

__all__ = ["CHUNK", "DeviceState", "WgSocket", "parse_dump", "set_requests"]

DeviceState = tuple[str | None, int | None, dict[str, DevicePeer]]
"""(private key, listen port, peers by public key), as ``parse_dump`` gives it."""

CHUNK = 16384
"""Bytes of peers per ``WG_CMD_SET_DEVICE`` (about 130 one-address peers): far below a
netlink socket's send buffer, and an error's echo of it fits the receive buffer. A
peer bigger than this alone goes in a message of its own."""
SOCKET_BUFFER = 1 << 20  # what pyroute2's sockets ask for
RECEIVE = 1 << 16
"""Bytes per read: above the 32 KiB the kernel puts in one dump datagram at most."""
TIMEOUT = 5.0
"""Seconds one answer may take on the socket (a set of ``CHUNK`` bytes, a dump's next
message); the caller's ``run_netlink`` bounds the whole batch."""

_NETLINK_GENERIC = 16  # not in the socket module's stubs
_CTRL_ATTR_FAMILY_ID, _CTRL_ATTR_FAMILY_NAME = 1, 2
_SOL_NETLINK, _NETLINK_CAP_ACK = 270, 10
_GENL = struct.Struct("=BBH")  # genlmsghdr: command, version, reserved
_U16, _U64 = struct.Struct("=H"), struct.Struct("=Q")
_IN4 = struct.Struct("=H2s4s8x")  # sockaddr_in: family, port (big-endian), address
_IN6 = struct.Struct("=H2s4s16sI")  # sockaddr_in6: family, port, flowinfo, address, scope
_TIMESPEC = struct.Struct("=qq")


# --- packing ----------------------------------------------------------------------------


def _key(value: str) -> bytes:
    return base64.b64decode(value)


def _endpoint(addr: str, port: int) -> bytes:
    packed_port = port.to_bytes(2, "big")
    if ":" in addr:
        packed = socket.inet_pton(socket.AF_INET6, addr)
        return _IN6.pack(socket.AF_INET6, packed_port, bytes(4), packed, 0)
    return _IN4.pack(socket.AF_INET, packed_port, socket.inet_pton(socket.AF_INET, addr))


def _allowed_ip(cidr: str) -> bytes:
    addr, _, mask = cidr.partition("/")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return b"".join(
        (
            attribute(WGALLOWEDIP_A_FAMILY, _U16.pack(family)),
            attribute(WGALLOWEDIP_A_IPADDR, socket.inet_pton(family, addr)),
            attribute(WGALLOWEDIP_A_CIDR_MASK, bytes([int(mask)])),
        )
    )


def peer_attributes(peer: Mapping[str, Any]) -> bytes:
    """One peer's attributes (a ``kernel.PeerMessage``), in the order pyroute2's
    ``AsyncWireGuard._wg_set_peer`` writes them."""
    parts = [attribute(WGPEER_A_PUBLIC_KEY, _key(peer["public_key"]))]
    if peer.get("remove"):
        parts.append(attribute(WGPEER_A_FLAGS, U32.pack(WGPEER_F_REMOVE_ME)))
        return b"".join(parts)
    if "endpoint_addr" in peer and "endpoint_port" in peer:
        parts.append(
            attribute(WGPEER_A_ENDPOINT, _endpoint(peer["endpoint_addr"], peer["endpoint_port"]))
        )
    if "preshared_key" in peer:
        parts.append(attribute(WGPEER_A_PRESHARED_KEY, _key(peer["preshared_key"])))
    if "persistent_keepalive" in peer:
        keepalive = _U16.pack(peer["persistent_keepalive"])
        parts.append(attribute(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, keepalive))
    flags = (WGPEER_F_UPDATE_ONLY if peer.get("update_only") else 0) | (
        WGPEER_F_REPLACE_ALLOWEDIPS if peer.get("replace_allowed_ips") else 0
    )
    parts.append(attribute(WGPEER_A_FLAGS, U32.pack(flags)))
    if "allowed_ips" in peer:
        ips = peer["allowed_ips"]
        parts.append(
            nested(
                WGPEER_A_ALLOWEDIPS,
                (nested(1 + i, [_allowed_ip(ip)]) for i, ip in enumerate(ips)),
            )
        )
    return b"".join(parts)


def _ifname(interface: str) -> bytes:
    return attribute(WGDEVICE_A_IFNAME, interface.encode() + b"\0")


def device_request(interface: str, private_key: str, listen_port: int) -> bytes:
    """The ``WG_CMD_SET_DEVICE`` payload (after the netlink header) that sets the key and port."""
    return b"".join(
        (
            _GENL.pack(WG_CMD_SET_DEVICE, WG_GENL_VERSION, 0),
            _ifname(interface),
            attribute(WGDEVICE_A_PRIVATE_KEY, _key(private_key)),
            attribute(WGDEVICE_A_LISTEN_PORT, _U16.pack(listen_port)),
        )
    )


def set_requests(
    interface: str, peers: Sequence[Mapping[str, Any]], chunk: int = CHUNK
) -> list[bytes]:
    """``WG_CMD_SET_DEVICE`` payloads (after the netlink header) carrying ``peers`` in
    order, each with at most ``chunk`` bytes of peers (at least one peer)."""
    head = _GENL.pack(WG_CMD_SET_DEVICE, WG_GENL_VERSION, 0) + _ifname(interface)
    requests: list[bytes] = []
    batch: list[bytes] = []
    size = 0

    def close() -> None:
        each = (nested(1 + i, [attrs]) for i, attrs in enumerate(batch))
        requests.append(head + nested(WGDEVICE_A_PEERS, each))

    for peer in peers:
        attrs = peer_attributes(peer)
        if batch and size + len(attrs) + ATTRIBUTE.size > chunk:
            close()
            batch, size = [], 0
        batch.append(attrs)
        size += len(attrs) + ATTRIBUTE.size
    if batch:
        close()
    return requests


def dump_request(interface: str) -> bytes:
    return _GENL.pack(WG_CMD_GET_DEVICE, WG_GENL_VERSION, 0) + _ifname(interface)


# --- parsing ----------------------------------------------------------------------------


def _endpoint_text(data: bytes, start: int) -> str:
    family = _U16.unpack_from(data, start)[0]
    port = int.from_bytes(data[start + 2 : start + 4], "big")
    if family == socket.AF_INET6:
        return f"[{ip_address(data[start + 8 : start + 24])}]:{port}"
    return f"{socket.inet_ntop(socket.AF_INET, data[start + 4 : start + 8])}:{port}"


def _allowed_text(data: bytes, start: int, end: int) -> str | None:
    family = mask = None
    addr = b""
    for kind, at, stop in attribute_spans(data, start, end):
        if kind == WGALLOWEDIP_A_FAMILY:
            family = _U16.unpack_from(data, at)[0]
        elif kind == WGALLOWEDIP_A_IPADDR:
            addr = data[at:stop]
        elif kind == WGALLOWEDIP_A_CIDR_MASK:
            mask = data[at]
    if family is None or mask is None:
        return None
    if family == socket.AF_INET and mask == 32:  # the usual case: no ipaddress parse
        return f"{socket.inet_ntop(family, addr)}/32"
    return str(ip_network((addr, mask), strict=False))


def _peer(data: bytes, start: int, end: int, peers: dict[str, dict[str, Any]]) -> None:
    fields: dict[str, Any] = {}
    allowed: list[str] = []
    for kind, at, stop in attribute_spans(data, start, end):
        if kind == WGPEER_A_PUBLIC_KEY:
            fields["public_key"] = base64.b64encode(data[at:stop]).decode("ascii")
        elif kind == WGPEER_A_ENDPOINT:
            fields["endpoint"] = _endpoint_text(data, at)
        elif kind == WGPEER_A_LAST_HANDSHAKE_TIME:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data, at)
            if seconds or nanoseconds:
                fields["last_handshake"] = seconds + nanoseconds / 1e9
        elif kind == WGPEER_A_RX_BYTES:
            fields["rx_bytes"] = _U64.unpack_from(data, at)[0]
        elif kind == WGPEER_A_TX_BYTES:
            fields["tx_bytes"] = _U64.unpack_from(data, at)[0]
        elif kind == WGPEER_A_ALLOWEDIPS:
            for _, item, item_end in attribute_spans(data, at, stop):
                text = _allowed_text(data, item, item_end)
                if text is not None:
                    allowed.append(text)
    key = fields.pop("public_key", None)
    if key is None:
        return
    peer = peers.setdefault(key, {"public_key": key, "allowed_ips": []})
    if fields.get("endpoint"):
        peer["endpoint"] = fields["endpoint"]
    for name in ("last_handshake", "rx_bytes", "tx_bytes"):
        if name in fields:
            peer[name] = fields[name]
    peer["allowed_ips"] += allowed


def parse_dump(messages: Iterable[bytes]) -> DeviceState:
    """A ``WG_CMD_GET_DEVICE`` dump (netlink messages as the kernel sends them) to
    (private key, listen port, peers by public key).

    A large device comes over several messages and one peer's allowed IPs may
    continue in the next one: they are merged by public key.
    """
    private_key: str | None = None
    port: int | None = None
    peers: dict[str, dict[str, Any]] = {}
    for data in messages:
        for kind, _, _, start, end in message_spans(data):
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                continue
            for attr, at, stop in attribute_spans(data, start + _GENL.size, end):
                if attr == WGDEVICE_A_PRIVATE_KEY:
                    private_key = base64.b64encode(data[at:stop]).decode("ascii")
                elif attr == WGDEVICE_A_LISTEN_PORT:
                    port = _U16.unpack_from(data, at)[0]
                elif attr == WGDEVICE_A_PEERS:
                    for _, peer, peer_end in attribute_spans(data, at, stop):
                        _peer(data, peer, peer_end, peers)
    return (
        private_key,
        port,
        {
            key: DevicePeer(**{**fields, "allowed_ips": tuple(sorted(fields["allowed_ips"]))})
            for key, fields in peers.items()
        },
    )


# --- the socket -------------------------------------------------------------------------


class WgSocket:
    """A ``NETLINK_GENERIC`` socket bound to WireGuard's family (sync; run it in a
    worker thread). ``kernel.WgClient``'s real implementation.

    Raises (from every call): ``NetlinkError`` with the kernel's errno (``ENOENT``
    when the family is missing: no wireguard module), ``OSError`` on the socket.
    """

    def __init__(self, netns: str | None = None) -> None:
        if netns is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_GENERIC)
        else:
            from pyroute2.netns import create_socket

            sock = create_socket(
                netns, socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_GENERIC, flags=0
            )
        self._socket = sock
        self._sequence = 0
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.setsockopt(_SOL_NETLINK, _NETLINK_CAP_ACK, 1)  # an error echoes no request
            sock.settimeout(TIMEOUT)
            sock.bind((0, 0))
            self.family = self._family_id()
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        self._socket.close()

    def _send(self, kind: int, flags: int, payload: bytes) -> int:
        self._sequence += 1
        header = HEADER.pack(HEADER.size + len(payload), kind, flags, self._sequence, 0)
        self._socket.send(header + payload)
        return self._sequence

    def _answers(self, sequence: int) -> Iterator[tuple[int, bytes, int, int]]:
        """(type, data, start, end) of each answer to ``sequence`` until its ack or
        NLMSG_DONE; an error answer raises ``NetlinkError``."""
        while True:
            data = self._socket.recv(RECEIVE)
            for kind, _, seq, start, end in message_spans(data):
                if seq != sequence:
                    continue  # a late answer to an earlier request of this socket
                if kind == NLMSG_ERROR:
                    code = -ERRNO.unpack_from(data, start)[0]
                    if code:
                        raise NetlinkError(code, os.strerror(code))
                    return
                if kind == NLMSG_DONE:  # a dump's end: its payload is its errno
                    code = -ERRNO.unpack_from(data, start)[0] if end - start >= 4 else 0
                    if code > 0:
                        raise NetlinkError(code, os.strerror(code))
                    return
                yield kind, data, start, end

    def _family_id(self) -> int:
        name = attribute(_CTRL_ATTR_FAMILY_NAME, WG_GENL_NAME.encode() + b"\0")
        payload = _GENL.pack(CTRL_CMD_GETFAMILY, 1, 0) + name
        sequence = self._send(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, payload)
        family: int | None = None
        for _, data, start, end in self._answers(sequence):
            for kind, at, _ in attribute_spans(data, start + _GENL.size, end):
                if kind == _CTRL_ATTR_FAMILY_ID:
                    family = _U16.unpack_from(data, at)[0]
        if family is None:
            raise NetlinkError(errno.ENOENT, "no wireguard generic netlink family")
        return family

    def _request(self, payload: bytes) -> None:
        for _ in self._answers(self._send(self.family, NLM_F_REQUEST | NLM_F_ACK, payload)):
            pass

    def set_device(self, interface: str, private_key: str, listen_port: int) -> None:
        """Set the device's private key and listen port."""
        self._request(device_request(interface, private_key, listen_port))

    def set_peers(self, interface: str, peers: Sequence[Mapping[str, Any]]) -> None:
        """Send ``peers`` (``kernel.PeerMessage`` s) in order, ``CHUNK`` bytes a message.
        The kernel applies a message's peers in order: a refused one leaves those
        before it applied and ends the batch."""
        for payload in set_requests(interface, peers):
            self._request(payload)

    def dump(self, interface: str) -> list[bytes]:
        """The device's ``WG_CMD_GET_DEVICE`` dump: its netlink messages, for ``parse_dump``."""
        sequence = self._send(self.family, NLM_F_REQUEST | NLM_F_DUMP, dump_request(interface))
        return [data[start - HEADER.size : end] for _, data, start, end in self._answers(sequence)]
