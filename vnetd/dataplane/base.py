"""The ``Dataplane`` protocol: one WireGuard device and its routes; and the optional
capabilities a data plane may have (``RestartingDataplane``, ``IdentifiedDataplane``,
``RestartCountingDataplane``).

Implementations: ``uapi.UapiDataplane`` (wireguard-go, configured over its
UAPI socket, link through pyroute2), ``kernel.KernelDataplane`` (in-kernel
WireGuard over generic netlink) and ``fake.FakeDataplane`` (in memory). All
pass ``tests/contract/test_dataplane.py`` (the kernel one where the kernel has
WireGuard).

Routing (invariant 9): the device holds the rank's own address with
no prefix route (in a dual-stack mesh one per family), each overlay
network is routed ``unreachable``, and each
present peer's allowed IPs get a route to the device, added with the peer
and removed with it. A packet for a rank that has not joined therefore
fails at once with "No route to host" on both data planes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network, ip_network
from typing import Protocol, runtime_checkable

from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Peer, Plan

DEFAULT_WIREGUARD_LOG = "error"
"""wireguard-go's ``LOG_LEVEL`` unless ``VNETD_WIREGUARD_LOG`` says otherwise: its
errors only, so the output it keeps stays small."""


@dataclass(frozen=True)
class DeviceConfig:
    """Everything needed to bring a device up."""

    interface: str
    private_key: str  # base64; never logged
    listen_port: int
    address: IPv4Interface | IPv6Interface  # the rank's address with the network's prefix
    network: IPv4Network | IPv6Network  # the spec's primary network
    mtu: int
    persistent_keepalive: int = 0
    preshared_key: str | None = None  # base64, mesh-wide; never logged
    address6: IPv6Interface | None = None  # dual stack: the rank's address in network6
    network6: IPv6Network | None = None  # dual stack: the spec's network6
    max_peers: int = 0
    """The most peers the device may hold (the mesh's size less one): scales the bound of
    a kernel data plane's first read of a link it adopts, whose peers it cannot know."""
    wireguard_log: str = DEFAULT_WIREGUARD_LOG
    """wireguard-go's ``LOG_LEVEL`` (``VNETD_WIREGUARD_LOG``); the kernel's device has none."""
    child_env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The variables wireguard-go starts with besides its own two: the daemon's, resolved
    with its settings (``vnetd.daemon_settings``); empty (tests): only those two."""

    @property
    def addresses(self) -> tuple[IPv4Interface | IPv6Interface, ...]:
        """The addresses the device holds, the primary first."""
        return (self.address,) if self.address6 is None else (self.address, self.address6)

    @property
    def networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """The networks routed ``unreachable``, the primary first."""
        return (self.network,) if self.network6 is None else (self.network, self.network6)

    def describe_addresses(self) -> str:
        """``10.250.0.2/24, fd00:250::2/64``: for log lines."""
        return ", ".join(str(addr) for addr in self.addresses)

    def __repr__(self) -> str:
        return (
            f"DeviceConfig(interface={self.interface!r}, listen_port={self.listen_port}, "
            f"addresses=[{self.describe_addresses()}], "
            f"networks=[{', '.join(str(net) for net in self.networks)}], mtu={self.mtu})"
        )


@dataclass(frozen=True)
class LinkState:
    """The device's link as the kernel shows it (for readiness)."""

    exists: bool
    up: bool = False
    addresses: frozenset[str] = frozenset()


class Dataplane(Protocol):
    """A configured device. Created up and ready by its ``open_*`` function."""

    async def peers(self) -> dict[str, DevicePeer]:
        """The device's peers, keyed by public key."""
        ...

    async def apply(self, plan: Plan) -> None:
        """Apply ``plan`` incrementally: remove, then update, then add.

        Only the peers named in the plan are touched; no other session is
        reset. Routes follow the peers.

        Raises:
            DataplaneError: the device refused the change.
        """
        ...

    async def routes(self) -> set[str]:
        """Destinations routed to the device (CIDR strings), for tests and status."""
        ...

    async def link_state(self) -> LinkState:
        """Whether the link exists, is up, and which addresses it holds."""
        ...


# Optional capabilities: a data plane has them or not; callers check with isinstance.


@runtime_checkable
class RestartingDataplane(Protocol):
    """A data plane whose device can be rebuilt empty (wireguard-go restarted).

    It calls ``on_restart(reason)`` afterwards; the daemon points that at the
    reconciler, which re-applies the whole state at once.
    """

    on_restart: Callable[[str], None] | None


@runtime_checkable
class IdentifiedDataplane(Protocol):
    """A data plane whose device instance has an id (16 hex digits)."""

    @property
    def device_id(self) -> str:
        """New whenever the device is started fresh, the same when it is adopted."""
        ...


@runtime_checkable
class RestartCountingDataplane(Protocol):
    """A data plane that counts the times its device died and was started again."""

    restarts: int


def device_id_of(dataplane: Dataplane) -> str:
    """The id of the data plane's device instance ("" for a data plane without one).
    It goes into our record, so peers can tell a restarted device from an adopted one."""
    return dataplane.device_id if isinstance(dataplane, IdentifiedDataplane) else ""


def restarts_of(dataplane: Dataplane) -> int:
    """How often the data plane's device was started again (0 for one that is never)."""
    return dataplane.restarts if isinstance(dataplane, RestartCountingDataplane) else 0


# Rules both data planes share (the fake must behave exactly like the device).


def key_to_hex(key: str, field: str = "public_key") -> str:
    """Base64 WireGuard key (as ``wg`` prints it) to the UAPI's hex form.

    Raises:
        DataplaneError: not 32 bytes of base64; the key itself is not echoed.
    """
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise DataplaneError(f"{field}: not a base64 WireGuard key (32 bytes)")
    return raw.hex()


def key_from_hex(value: str) -> str:
    """The UAPI's hex key to base64."""
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def route_changes(plan: Plan, live: AbstractSet[str]) -> tuple[set[str], set[str]]:
    """Routes to delete and to add after ``plan``, given the allowed IPs now live.

    A destination still held by some peer (WireGuard moved it) is never
    deleted; one no peer holds is never added.
    """
    gone: set[str] = set()
    new: set[str] = set()
    for peer in plan.remove:
        gone.update(peer.allowed_ips)
    for upd in plan.update:
        if upd.allowed_ips is not None:
            gone.update(set(upd.old_allowed_ips) - set(upd.allowed_ips))
            new.update(upd.allowed_ips)
    for peer in plan.add:
        new.update(peer.allowed_ips)
    gone = {_cidr(ip) for ip in gone}
    new = {_cidr(ip) for ip in new}
    return gone - live - new, new & live


def keepalive_of(peer: Peer, default: int) -> int:
    """The persistent keepalive ``peer`` is added with: its own, else the device's."""
    return default if peer.keepalive is None else peer.keepalive


def handshake_keepalives(plan: Plan, default: int) -> dict[str, int]:
    """The keepalive each peer of ``plan.handshake`` ends with after its handshake is
    started: the one it is added with in the plan."""
    handshake = set(plan.handshake)
    return {
        peer.public_key: keepalive_of(peer, default)
        for peer in plan.add
        if peer.public_key in handshake
    }


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4_HOST = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}/32")
"""An IPv4 host route already in normal form (the spec writes every allowed IP so)."""


def _cidr(ip: str) -> str:
    """``ip`` in normal form. A join moves a thousand routes: an IPv4 host route in
    normal form is taken as it is (a match costs 1 µs, ``ipaddress`` 10-20 µs)."""
    return ip if _IPV4_HOST.fullmatch(ip) else _parsed_cidr(ip)


@functools.lru_cache(maxsize=1 << 12)
def _parsed_cidr(ip: str) -> str:
    return str(ip_network(ip, strict=False))
