"""Frozen, sortable records shared by the pure core and the adapters.

Public keys are the standard base64 form that ``wg`` prints. Endpoints are
``host:port`` with IPv6 hosts in brackets. The records' own rules are here
too (``check_endpoint``, ``check_public_key``): the registry's codec, the
settings and the commands apply the same ones. Allowed IPs are CIDR strings,
kept sorted so that equal records compare equal.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

from vnetd.spec.records import DEFAULT_SITE


@dataclass(frozen=True, order=True)
class Member:
    """One rank's registration as read from the registry.

    ``device_id`` names the WireGuard device instance behind the key: a new one
    whenever wireguard-go is started fresh, kept when a running one is adopted.
    Peers that see it change under the same key drop their old session with it
    (``""``: unknown, as in records of older versions).

    ``endpoint`` is reachable from the member's own ``site``;
    ``public_endpoint``, if any, from every site (docs/architecture.md, "Sites").

    ``signing_key`` is the holder's Ed25519 public key (base64), whose signature
    the record carried and which verified (``""``: an unsigned record, as older
    versions write). Only its holder can change a signed entry
    (docs/architecture.md, "Registry layout").

    ``cert`` is the holder's rank certificate (base64 DER, covered by the proof):
    where the spec pins a rank CA (``mesh.rank_ca``) it vouches for ``signing_key``
    at this rank (``control.rank_cert``); ``""``: none.
    ``seq`` orders one signing key's records at a rank: each record its holder
    writes carries a higher one, covered by the proof; readers refuse one not
    after the highest they accepted (0: a record of an older version, not ordered).
    """

    rank: int
    public_key: str
    endpoint: str | None
    instance: str
    started: float = 0.0
    version: str = ""
    device_id: str = ""
    site: str = DEFAULT_SITE
    public_endpoint: str | None = None
    signing_key: str = ""
    cert: str = ""
    seq: int = 0

    def endpoint_from(self, site: str) -> str | None:
        """The endpoint a member of ``site`` reaches this one at: its site endpoint
        within its own site, else its public one; None when it has none there."""
        return self.endpoint if self.site == site else self.public_endpoint


@dataclass(frozen=True, order=True)
class Peer:
    """A WireGuard peer as vnetd wants it (or as a device reports it).

    ``keepalive`` is the persistent keepalive (s) to add it with; ``None``: the
    device's default (``DeviceConfig.persistent_keepalive``). A peer added with
    ``endpoint_held`` is added without its endpoint: it waits for the other
    side's handshake, which teaches the device the endpoint (invariant 10).
    """

    public_key: str
    allowed_ips: tuple[str, ...]
    endpoint: str | None = None
    rank: int | None = field(default=None, compare=False)
    device_id: str = field(default="", compare=False)
    keepalive: int | None = field(default=None, compare=False)
    """Persistent keepalive (s) set when the peer is added; None: the device's."""
    endpoint_held: bool = field(default=False, compare=False)

    def added_as(self, keepalive: int | None, endpoint_held: bool) -> Peer:
        """This peer with ``keepalive`` and ``endpoint_held`` (``dataclasses.replace``
        at a third of its cost: a join adds a thousand peers in one pass)."""
        return Peer(
            self.public_key,
            self.allowed_ips,
            self.endpoint,
            self.rank,
            self.device_id,
            keepalive,
            endpoint_held,
        )


@dataclass(frozen=True, order=True)
class DevicePeer:
    """A peer as the data plane reports it, with its live counters."""

    public_key: str
    allowed_ips: tuple[str, ...]
    endpoint: str | None = None
    last_handshake: float = 0.0
    rx_bytes: int = 0
    tx_bytes: int = 0

    def as_peer(self) -> Peer:
        return Peer(self.public_key, self.allowed_ips, self.endpoint)


@dataclass(frozen=True, order=True)
class PeerUpdate:
    """A change to an existing peer; ``None`` fields are left as they are."""

    public_key: str
    endpoint: str | None = None
    allowed_ips: tuple[str, ...] | None = None
    old_allowed_ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What to change on a device. Applied in the order remove, update, add.

    ``remove`` carries the removed peers' last known allowed IPs so the data
    plane can drop their routes. ``handshake`` names peers (public keys) to
    start a handshake with as soon as the plan is applied instead of at our
    next packet for them: the peers whose handshakes this side starts
    (invariant 10), when they are added, re-added because their device was
    restarted, or re-added because a first handshake did not complete (all
    in ``add``); and lazy peers already on the device whose responder rang
    our doorbell (a plan of only those is not empty). ``left_restarted``
    changes nothing: it names peers whose device was restarted and which
    this side leaves as they are, since the other side starts their
    handshake (for the log).
    """

    remove: tuple[Peer, ...] = ()
    update: tuple[PeerUpdate, ...] = ()
    add: tuple[Peer, ...] = ()
    handshake: tuple[str, ...] = ()
    left_restarted: tuple[Peer, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.remove or self.update or self.add or self.handshake)

    def __len__(self) -> int:
        return len(self.remove) + len(self.update) + len(self.add)

    def describe(self, limit: int = 16) -> str:
        """One short line for the log: what changes, by rank where known.

        A plan of more than ``limit`` changes is shown as counts.
        """
        if len(self) > limit:
            return f"+{len(self.add)} -{len(self.remove)} ~{len(self.update)} peers"
        parts: list[str] = []
        for peer in self.add:
            parts.append(f"+{_label(peer)}")
        for peer in self.remove:
            parts.append(f"-{_label(peer)}")
        for upd in self.update:
            what = []
            if upd.endpoint is not None:
                what.append(f"endpoint={upd.endpoint}")
            if upd.allowed_ips is not None:
                what.append(f"allowed_ips={','.join(upd.allowed_ips)}")
            parts.append(f"~{upd.public_key[:8]}({' '.join(what)})")
        return " ".join(parts) if parts else "no change"


def _label(peer: Peer) -> str:
    return f"rank{peer.rank}" if peer.rank is not None else peer.public_key[:8]


@dataclass(frozen=True)
class KeyPair:
    """A WireGuard key pair, base64; made and read by ``vnetd.keys``."""

    private_key: str
    public_key: str

    def __repr__(self) -> str:  # the private key never reaches a log
        return f"KeyPair(public_key={self.public_key!r})"


def check_public_key(value: str) -> str:
    """Validate a WireGuard public key (base64 of 32 bytes, as ``wg pubkey`` prints it).

    Raises:
        ValueError: ``is not base64`` or ``is N bytes, not 32``.
    """
    key_bytes(value)
    return value


def key_bytes(value: str) -> bytes:
    """The 32 raw bytes of a base64 key (WireGuard's X25519, a record's Ed25519).

    Raises:
        ValueError: ``is not base64`` or ``is N bytes, not 32``.
    """
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"is {len(raw)} bytes, not 32")
    return raw


def check_endpoint(value: str) -> str:
    """Validate ``ip:port`` (``[ip6]:port``) and return it in canonical form.

    Raises:
        ValueError: with a message saying what is wrong.
    """
    return parse_endpoint(value)[0]


def parse_endpoint(value: str) -> tuple[str, IPv4Address | IPv6Address]:
    """``check_endpoint``, with the endpoint's address (every reader of a record parses
    it once, not twice).

    Raises:
        ValueError: with a message saying what is wrong.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not is_ascii_number(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{_shown(value)} is not HOST:PORT with a port in 1..65535")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        addr = ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(f"{_shown(value)}: {ascii(host)} is not an IP address") from None
    if addr.version == 6 and addr.scope_id is not None:
        # A zone names an interface of the writer's host: meaningless to a peer,
        # and wireguard-go refuses an unknown one, failing the whole transaction.
        raise ValueError(f"{_shown(value)}: an IPv6 zone (%...) is not allowed in an endpoint")
    if addr.version == 6 and not bracketed:
        raise ValueError(f"{_shown(value)}: an IPv6 address needs brackets, as [{host}]:{port}")
    kind = _not_an_endpoint(addr)
    if kind:
        # Written by anyone, it would aim every peer's handshakes at the peers' own host,
        # a metadata service (169.254.169.254) or a group: never a peer's underlay.
        raise ValueError(f"{_shown(value)}: a {kind} address cannot be a peer's endpoint")
    canonical = f"[{addr}]:{int(port)}" if addr.version == 6 else f"{addr}:{int(port)}"
    return canonical, addr


def _shown(value: str) -> str:
    return ascii(value) if len(value) <= 80 else f"{ascii(value[:80])}..."


_BROADCAST = IPv4Address("255.255.255.255")


def _not_an_endpoint(addr: IPv4Address | IPv6Address) -> str | None:
    """What kind of address ``addr`` is if no peer can be reached at it, else None."""
    if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_unspecified:
        return "unspecified"
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_multicast:
        return "multicast"
    if addr == _BROADCAST:
        return "broadcast"
    return None


def is_ascii_number(text: str) -> bool:
    """``0`` or an ASCII decimal without leading zeros, of at most 18 digits (``int()``
    refuses strings of over 4300 digits, and no rank or port needs more than 18)."""
    return (
        0 < len(text) <= 18
        and text.isascii()
        and text.isdigit()
        and (text == "0" or not text.startswith("0"))
    )
