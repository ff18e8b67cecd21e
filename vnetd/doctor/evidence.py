"""What one daemon's probe service reports for its row, and its JSON form on the wire.

Pure: records and their codec only. The service (``vnetd.daemon.probe_service``)
fills them in, the doctor (``vnetd.commands.doctor.gather``) decodes them, and
``vnetd.doctor.cause`` reads them; see docs/architecture.md, "Doctor".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

MAGIC = b"vnetd-doctor1"
"""First bytes of every echo datagram; anything else is ignored."""
SMALL = 64
"""Size of the small echo (inner IP packet, bytes)."""
LAG_LIMIT = 1.0
"""Event-loop lag (s) above which a row's losses are not evidence of a network fault:
an echo sent or answered that late by a starved daemon may be lost to the wait alone."""
MAX_REQUEST = 1 << 20
MAX_ROW = 16 << 20
"""Largest request and answer line accepted (bytes)."""


class WireError(ValueError):
    """A request or row that does not decode (a bug or a foreign program: never a crash)."""


@dataclass(frozen=True)
class PeerSeen:
    """What one daemon's device and echoes say about one other rank.

    ``key`` is the public key of the device peer whose allowed IPs hold the
    rank's address (the rank itself, or a gateway), None when no peer does.
    Sizes are inner IP packet sizes; ``largest`` is the largest that came back
    (None: not even the small one).
    """

    rank: int
    key: str | None = None
    endpoint: str | None = None
    handshake_age: float | None = None
    """Seconds since the last handshake with that peer; None: never."""
    rx_bytes: int = 0
    tx_bytes: int = 0
    small_rtt: float | None = None
    """Round trip of the small echo (s); None: lost."""
    full_rtt: float | None = None
    """Round trip of the full-size echo (the device MTU); None: lost."""
    largest: int | None = None
    delivered: int = 0
    """Bytes the device received from that peer while the probe ran: a tunnel that
    carries something back even when no echo does (a keepalive is 32 bytes)."""
    lag: float = 0.0
    """How late the prober's event loop ran at worst while it probed (s): a loss seen
    with a large lag may be the wait's, not the network's."""
    echoed: int = 0
    """Echoes from that rank (its primary overlay address) this daemon's service received
    while it probed: proof that its inner packets reach this pod's sockets."""
    written: int = 0
    """Bytes of echoes (inner IP packets) this daemon's probe wrote to that rank's address:
    sends that passed or that a firewall rule in the pod refused, not those too big for
    the route or with none. Optional on the wire (0: an older daemon, or nothing written)."""
    sent: int = 0
    """Bytes the device sent to that peer while the probe ran. Every inner packet that
    reaches the device leaves it as at least its size plus 32 bytes, so ``sent`` below
    ``written`` on a session that is up shows echoes dropped in this pod on their way
    out, before its device. Optional on the wire."""


@dataclass(frozen=True)
class Row:
    """One daemon's answer: who it is and what it sees of each rank asked about."""

    rank: int
    instance: str
    public_key: str
    mtu: int
    peers: Mapping[int, PeerSeen] = field(default_factory=dict)


@dataclass(frozen=True)
class RowRequest:
    """What the doctor asks a service: the ranks to probe and a deadline (s)."""

    ranks: tuple[int, ...]
    deadline: float


def encode_request(request: RowRequest) -> bytes:
    return json.dumps({"v": 1, "ranks": list(request.ranks), "deadline": request.deadline}).encode()


def decode_request(line: bytes, size: int) -> RowRequest:
    """The request in ``line``; ranks outside ``0..size-1`` are refused.

    Raises:
        WireError: it is not a request of this protocol.
    """
    try:
        data = json.loads(line)
        ranks = tuple(int(r) for r in data["ranks"] if not isinstance(r, bool))
        deadline = float(data["deadline"])
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"not a doctor request: {exc}") from None
    if data.get("v") != 1 or any(not 0 <= r < size for r in ranks) or not 0 < deadline <= 600:
        raise WireError("doctor request out of range")
    return RowRequest(ranks, deadline)


def encode_row(row: Row) -> bytes:
    document = asdict(row)
    document["peers"] = [asdict(seen) for seen in row.peers.values()]
    return json.dumps({"v": 1, **document}, separators=(",", ":")).encode()


def decode_row(line: bytes) -> Row:
    """The row in ``line``.

    Raises:
        WireError: it is not a row of this protocol.
    """
    try:
        data: dict[str, Any] = json.loads(line)
        if data.get("v") != 1:
            raise WireError("unknown doctor row version")
        peers = {int(p["rank"]): _peer(p) for p in data["peers"]}
        return Row(
            rank=int(data["rank"]),
            instance=str(data["instance"]),
            public_key=str(data["public_key"]),
            mtu=int(data["mtu"]),
            peers=peers,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WireError(f"not a doctor row: {exc}") from None


def _peer(data: Mapping[str, Any]) -> PeerSeen:
    def opt_float(name: str) -> float | None:
        value = data.get(name)
        return None if value is None else float(value)

    largest = data.get("largest")
    return PeerSeen(
        rank=int(data["rank"]),
        key=None if data.get("key") is None else str(data["key"]),
        endpoint=None if data.get("endpoint") is None else str(data["endpoint"]),
        handshake_age=opt_float("handshake_age"),
        rx_bytes=int(data.get("rx_bytes", 0)),
        tx_bytes=int(data.get("tx_bytes", 0)),
        small_rtt=opt_float("small_rtt"),
        full_rtt=opt_float("full_rtt"),
        largest=None if largest is None else int(largest),
        delivered=int(data.get("delivered", 0)),
        lag=float(data.get("lag", 0.0)),
        echoed=int(data.get("echoed", 0)),
        written=int(data.get("written", 0)),
        sent=int(data.get("sent", 0)),
    )


def merge_rows(first: Row, second: Row | None) -> Row:
    """``first`` with each peer the ``second`` pass saw pass as far or further (small,
    then full): when both failed, the second, lighter pass is the evidence kept."""
    if second is None:
        return first
    peers = dict(first.peers)
    for rank, seen in second.peers.items():
        old = peers.get(rank)
        if old is None or _passes(seen) >= _passes(old):
            peers[rank] = seen
    return replace(first, peers=peers)


def _passes(seen: PeerSeen) -> int:
    return (seen.small_rtt is not None) + (seen.full_rtt is not None)
