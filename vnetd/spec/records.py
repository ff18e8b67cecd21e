"""The spec's records: the validated mesh spec and its address plan.

Rank ``r`` owns host ``offset + r`` of ``network`` (and of ``network6``);
see docs/spec.md for every key and ``vnetd.spec.parse`` for the checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
)
from typing import Any

from vnetd.errors import SpecError

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network


@dataclass(frozen=True)
class RegistrySpec:
    endpoints: tuple[str, ...] = ("http://127.0.0.1:2379",)
    prefix: str = "/vnetd"
    lease_ttl: int = 10
    ca_file: str | None = None
    """PEM CA that signed etcd's server certificate (https endpoints); None: the system's."""
    cert_file: str | None = None
    """PEM client certificate for etcd's ``--client-cert-auth``, with ``key_file``."""
    key_file: str | None = None
    username: str | None = None
    """etcd user (auth enabled); the password comes from ``password_file`` or the env."""
    password_file: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)
    """The password once read (``vnetd.config``); never from the TOML, never shown."""
    relays: tuple[str, ...] = ()
    """URLs of ``vnetd relay`` processes the members are read through, tried in order
    before etcd itself (docs/architecture.md, "Relay"); empty: etcd only."""
    watch: str = "json"
    """How the member watch reaches etcd (``WATCH_TRANSPORTS``): ``json``, its v3 JSON
    gateway as every other call; ``grpc``, native gRPC (8x less of etcd's CPU per event,
    and served by etcd's grpc-proxy)."""
    watch_endpoints: tuple[str, ...] = ()
    """Where a ``grpc`` watch goes (etcd members, or an etcd grpc-proxy); empty: ``endpoints``."""


WATCH_TRANSPORTS = ("json", "grpc")


def check_watch(value: object, key: str) -> str:
    """``value`` if it names a watch transport; ``key`` names where it came from."""
    if value not in WATCH_TRANSPORTS:
        raise SpecError(f"{key}: {value!r} is not one of {', '.join(WATCH_TRANSPORTS)}")
    return str(value)


@dataclass(frozen=True)
class HttpSpec:
    listen: str | None = None
    """``host:port`` of the health, readiness, metrics and status endpoint; None: off."""


DATAPLANE_KINDS = ("auto", "kernel", "userspace", "fake")
"""Every data-plane kind, the one list: ``vnetd up --dataplane`` takes them all, the
data-plane port opens each (``auto`` chooses one of the next two)."""
FLAG_ONLY_DATAPLANES = ("fake",)
"""Kinds for tests and benches (``fake``: in memory), a flag's only: never the spec's."""
DATAPLANES = tuple(kind for kind in DATAPLANE_KINDS if kind not in FLAG_ONLY_DATAPLANES)
"""The kinds ``[wireguard] dataplane`` takes."""


@dataclass(frozen=True)
class DataplaneSpec:
    """``[wireguard] dataplane``: local to each node, not part of ``[mesh]``."""

    dataplane: str = "auto"
    """auto: the kernel's WireGuard when a link can be created, else wireguard-go."""
    preshared_key_file: str | None = None
    """A file holding the mesh-wide pre-shared key (base64), e.g. a mounted Secret."""
    signing_key_file: str | None = None
    """A file holding this node's record signing key (``signing.key``'s format), e.g.
    a pinned gateway's; None: the state dir's ``signing.key``."""
    rank_cert_file: str | None = None
    """A file holding this node's rank certificate (DER or PEM), where ``[mesh]
    rank_ca`` is pinned; None: none."""


DEFAULT_SITE = "default"
"""The site of a member that names none (every member of a single-site mesh)."""
DEFAULT_SITE_KEEPALIVE = 25
DEFAULT_DOCTOR_PORT = 51821
"""TCP and UDP port of each daemon's probe service on its overlay address (``vnetd doctor``)."""
DEFAULT_DOORBELL_PORT = 51822
"""UDP port of each daemon's doorbell on its underlay (``mesh.tree_fanout``; docs/architecture.md,
"Reconciler": handshakes follow the traffic)."""


@dataclass(frozen=True)
class SiteSpec:
    """``[site]``: where this node is (docs/architecture.md, "Sites"); local, not compared."""

    name: str = DEFAULT_SITE
    public_endpoint: str | None = None
    """``ip:port`` that other sites reach this member at (a forwarded port); None: none."""


@dataclass(frozen=True)
class MeshSpec:
    """A validated spec. Build it with ``load_spec`` or ``parse_spec``."""

    name: str
    size: int
    network: IPNetwork
    """The primary network: IPv4, or IPv6 in an IPv6-only mesh."""
    port: int = 51820
    interface: str = "vnet0"
    mtu: int | str = 1420
    """An MTU, or "auto": each daemon's underlay MTU minus WireGuard's overhead."""
    hostname: str = "{name}-{rank}"
    offset: int = 1
    persistent_keepalive: int = 0
    registry: RegistrySpec = RegistrySpec()
    http: HttpSpec = HttpSpec()
    local: DataplaneSpec = DataplaneSpec()
    network6: IPv6Network | None = None
    """Dual stack: the IPv6 network beside an IPv4 ``network``; None: one family."""
    site_keepalive: int = DEFAULT_SITE_KEEPALIVE
    doctor_port: int = DEFAULT_DOCTOR_PORT
    """The probe service's port on the overlay address; 0: not served."""
    tree_fanout: int = 0
    """``K`` of the jobs' k-ary tree (Flux's ``tbon.fanout``): handshakes are started at
    once only with tree neighbours, gateways and peers with keepalives, every other pair
    on its first packet; 0: every pair at once (``mesh.eager``)."""
    doorbell_port: int = DEFAULT_DOORBELL_PORT
    """UDP port of the doorbell a lazy pair's responder rings (only with ``tree_fanout``)."""
    """Persistent keepalive (s) of peers in another site; 0: off."""
    gateways: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """``[sites.<name>] gateways``: (site, its gateway ranks), sorted by site; () : none."""
    gateway_keys: tuple[tuple[int, str], ...] = ()
    """``[sites.<name>] gateway_keys``: (gateway rank, the record signing public key
    pinned for it), sorted by rank; () : none pinned."""
    rank_ca: tuple[str, ...] = ()
    """``[mesh] rank_ca``: the Ed25519 public keys (base64) whose rank certificates
    vouch for a record's signing key at its rank (``control.rank_cert``), more than
    one while a CA is rotated; () : records are not vouched for."""
    site: SiteSpec = SiteSpec()

    @property
    def networks(self) -> tuple[IPNetwork, ...]:
        """The overlay networks, the primary first."""
        return (self.network,) if self.network6 is None else (self.network, self.network6)

    @property
    def versions(self) -> tuple[int, ...]:
        """The IP versions of the overlay, the primary first: (4,), (6,) or (4, 6)."""
        return tuple(net.version for net in self.networks)

    @property
    def min_mtu(self) -> int:
        """The smallest MTU the overlay may have: IPv6 needs 1280, IPv4 576."""
        return min_mtu_of(self.networks)

    def address(self, rank: int) -> IPAddress:
        """The fixed overlay address of ``rank`` in the primary ``network``."""
        return self.addresses(rank)[0]

    def addresses(self, rank: int) -> tuple[IPAddress, ...]:
        """The rank's fixed overlay addresses, one per network, the primary first."""
        self.check_rank(rank)
        return tuple(net.network_address + self.offset + rank for net in self.networks)

    def address_in(self, rank: int, version: int) -> IPAddress:
        """The rank's address of IP version ``version`` (4 or 6).

        Raises:
            ValueError: the mesh has no network of that version (see ``versions``).
        """
        for addr in self.addresses(rank):
            if addr.version == version:
                return addr
        raise ValueError(f"mesh {self.name} has no IPv{version} network")

    def interface_address(self, rank: int) -> IPv4Interface | IPv6Interface:
        """The rank's primary address with the network's prefix length."""
        return self.interface_addresses(rank)[0]

    def interface_addresses(self, rank: int) -> tuple[IPv4Interface | IPv6Interface, ...]:
        """The rank's addresses with their networks' prefix lengths, the primary first."""
        found: list[IPv4Interface | IPv6Interface] = []
        for addr, net in zip(self.addresses(rank), self.networks, strict=True):
            if isinstance(addr, IPv4Address):
                found.append(IPv4Interface(f"{addr}/{net.prefixlen}"))
            else:
                found.append(IPv6Interface(f"{addr}/{net.prefixlen}"))
        return tuple(found)

    def interface_address6(self, rank: int) -> IPv6Interface | None:
        """Dual stack: the rank's address in ``network6`` with its prefix length, else None."""
        if self.network6 is None:
            return None
        address6 = self.interface_addresses(rank)[1]
        assert isinstance(address6, IPv6Interface)  # network6 is IPv6 (parse_spec)
        return address6

    def allowed_ips(self, rank: int) -> tuple[str, ...]:
        """The allowed IPs a peer of ``rank`` gets: each address as a host route (/32,
        /128), sorted as the data planes report them."""
        routes = self._routes.get(rank)
        if routes is None:
            routes = tuple(sorted(f"{a}/{a.max_prefixlen}" for a in self.addresses(rank)))
            self._routes[rank] = routes
        return routes

    @cached_property
    def _routes(self) -> dict[int, tuple[str, ...]]:
        # Every reconcile pass asks for every member's allowed IPs; building them with
        # ipaddress was 75 % of a pass at 1024 ranks (profile of bench/control_plane.py).
        # Filled on demand: at most one entry per rank that is asked for.
        return {}

    def pinned_key(self, rank: int) -> str | None:
        """The signing public key pinned for gateway ``rank`` (``[sites.<name>]
        gateway_keys``), or None: its records may be signed by any key."""
        return self._pins.get(rank)

    @cached_property
    def _pins(self) -> dict[int, str]:
        return dict(self.gateway_keys)

    def site_of_gateway(self, rank: int) -> str | None:
        """The site whose ``gateways`` list ``rank``, or None."""
        return next((site for site, ranks in self.gateways if rank in ranks), None)

    def host(self, rank: int) -> str:
        """The hostname of ``rank`` from the spec's pattern."""
        self.check_rank(rank)
        return self.hostname.replace("{name}", self.name).replace("{rank}", str(rank))

    def rank_of_host(self, hostname: str) -> int | None:
        """The rank whose hostname is ``hostname`` (or its first label), else None."""
        pattern = re.escape(self.hostname.replace("{name}", self.name))
        pattern = pattern.replace(re.escape("{rank}"), r"(0|[1-9][0-9]*)")
        for candidate in (hostname, hostname.split(".", 1)[0]):
            match = re.fullmatch(pattern, candidate)
            if match:
                rank = int(match.group(1))
                return rank if rank < self.size else None
        return None

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise SpecError(f"rank {rank} is out of range: the mesh has ranks 0..{self.size - 1}")

    def mesh_table(self) -> dict[str, Any]:
        """The ``[mesh]`` table with defaults filled in, as JSON-ready values."""
        table = asdict(self)
        del table["registry"]
        del table["http"]
        del table["local"]
        del table["site"]
        if self.site_keepalive == DEFAULT_SITE_KEEPALIVE:
            del table["site_keepalive"]  # absent at its default: older meshes compare equal
        if self.doctor_port == DEFAULT_DOCTOR_PORT:
            del table["doctor_port"]  # as site_keepalive
        if not self.tree_fanout:
            del table["tree_fanout"]  # as site_keepalive
        if self.doorbell_port == DEFAULT_DOORBELL_PORT:
            del table["doorbell_port"]  # as site_keepalive
        if self.gateways:
            table["gateways"] = {site: list(ranks) for site, ranks in self.gateways}
        else:
            del table["gateways"]
        if self.gateway_keys:
            table["gateway_keys"] = {str(rank): key for rank, key in self.gateway_keys}
        else:
            del table["gateway_keys"]  # absent without pins: older meshes compare equal
        if self.rank_ca:
            table["rank_ca"] = list(self.rank_ca)
        else:
            del table["rank_ca"]  # as gateway_keys
        table["network"] = str(self.network)
        if self.network6 is None:
            # Absent, not null: the stored spec of a mesh made before network6 existed
            # compares equal to a spec without it.
            del table["network6"]
        else:
            table["network6"] = str(self.network6)
        return table

    def canonical_json(self) -> bytes:
        """The form stored in the registry: every daemon of a mesh must agree on it."""
        return json.dumps(self.mesh_table(), sort_keys=True, separators=(",", ":")).encode()

    def differing_keys(self, stored: bytes) -> list[str]:
        """Keys of ``[mesh]`` whose stored value differs from ours (sorted)."""
        try:
            other = json.loads(stored)
        except ValueError:
            return ["<unparseable>"]
        if not isinstance(other, dict):
            return ["<unparseable>"]
        mine = self.mesh_table()
        return sorted(k for k in mine.keys() | other.keys() if mine.get(k) != other.get(k))


def min_mtu_of(networks: Sequence[IPNetwork]) -> int:
    """IPv6 needs an MTU of at least 1280; IPv4 576."""
    return 1280 if any(net.version == 6 for net in networks) else 576
