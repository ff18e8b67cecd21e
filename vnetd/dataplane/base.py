"""The ``Dataplane`` protocol: one WireGuard device and its routes.

Implementations: ``uapi.UapiDataplane`` (wireguard-go, configured over its
UAPI socket, link through pyroute2) and ``fake.FakeDataplane`` (in memory).
Both pass ``tests/contract/test_dataplane.py``.

Routing (DESIGN invariant 9): the device holds the rank's own address with
no prefix route, the overlay network is routed ``unreachable``, and each
present peer's allowed IPs get a route to the device, added with the peer
and removed with it. A packet for a rank that has not joined therefore
fails at once with "No route to host" on both data planes.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Protocol

from vnetd.model import DevicePeer, Plan


@dataclass(frozen=True)
class DeviceConfig:
    """Everything needed to bring a device up."""

    interface: str
    private_key: str  # base64; never logged
    listen_port: int
    address: IPv4Interface | IPv6Interface  # the rank's address with the network's prefix
    network: IPv4Network | IPv6Network
    mtu: int
    persistent_keepalive: int = 0

    def __repr__(self) -> str:
        return (
            f"DeviceConfig(interface={self.interface!r}, listen_port={self.listen_port}, "
            f"address={self.address}, network={self.network}, mtu={self.mtu})"
        )


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
