"""The doorbell: where a lazy pair's responder sends its first handshake, so we start it.

With ``mesh.tree_fanout`` a lazy pair's responder holds the initiator's
doorbell (its endpoint's host, ``mesh.doorbell_port``) as the peer's endpoint
(``PairRule.device_endpoint``): its first packet for us makes its WireGuard
send a handshake initiation here instead of to our WireGuard, where it could
cross ours. We take the datagram's source (the responder's WireGuard endpoint)
to the reconciler (``Reconciler.ring``), which starts the handshake from our
side. Nothing of the datagram is trusted: a forged ring can only make us
start a handshake with a peer we hold. Written by hand: a UDP socket on trio,
no library has a part of it. docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import trio

from vnetd.errors import VnetdError
from vnetd.mesh.eager import endpoint_of

log = logging.getLogger("vnetd.reconcile")

INITIATION = (1).to_bytes(4, "little")
"""WireGuard's handshake initiation: message type 1 and three reserved zero bytes."""
INITIATION_SIZE = 148


def is_initiation(data: bytes) -> bool:
    """``data`` has the shape of a WireGuard handshake initiation."""
    return len(data) == INITIATION_SIZE and data.startswith(INITIATION)


def _open_socket(port: int) -> trio.socket.SocketType:
    """A UDP socket on every address of both families (IPv4 alone where the host has no IPv6)."""
    try:
        sock = trio.socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    except OSError:
        return trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return sock


async def serve_doorbell(
    port: int,
    on_ring: Callable[[str], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Take rings on UDP ``port`` until cancelled; ``on_ring`` gets each ringer's endpoint.

    Raises:
        VnetdError: the port cannot be bound.
    """
    sock = _open_socket(port)
    with sock:
        host = "::" if sock.family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 (the underlay)
        try:
            await sock.bind((host, port))
        except OSError as exc:
            raise VnetdError(
                f"mesh.doorbell_port {port}: cannot bind it: {exc.strerror or exc} (pick a "
                "free port, the same on every node)"
            ) from None
        log.info("doorbell at port %d (udp): lazy pairs' first packets ring here", port)
        task_status.started()
        while True:
            try:
                data, source = await sock.recvfrom(INITIATION_SIZE + 1)
            except OSError:
                continue  # an ICMP error queued on the socket
            if is_initiation(data):
                on_ring(endpoint_of(source[0], source[1]))
