"""What several unit test files share: made-up keys, a small spec, a flaky data plane.

A plain module, imported by name (``from shared import key``): pytest imports
every ``conftest.py`` of the tree as a module called ``conftest``, so helpers
that tests import cannot live there; the fixtures do (``conftest.py`` here).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from vnetd.config import Settings
from vnetd.daemon_settings import DaemonSettings, resolve_daemon_settings
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import DataplaneError
from vnetd.identity import resolve_endpoint, resolve_rank_or_auto
from vnetd.model import Plan
from vnetd.registry.base import KeyValue, Registry
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}})
"""A four-rank mesh with nothing but its required keys."""


def daemon_settings(
    flags: Settings, env: Mapping[str, str], hostname: str = "unit-host"
) -> DaemonSettings:
    """``flags`` resolved with ``env`` as ``vnetd up`` does, with no host read: the
    endpoint from ``--endpoint`` or ``POD_IP``, the spec's MTU a number."""
    mtu = flags.spec.mtu
    assert isinstance(mtu, int), "mesh.mtu auto reads the host"
    endpoint = resolve_endpoint(flags.spec, flags.endpoint, env, None)
    rank = resolve_rank_or_auto(flags.spec, flags.rank, env, hostname)
    return resolve_daemon_settings(
        flags, env, hostname=hostname, rank=rank, endpoint=endpoint, mtu=mtu
    )


def byte_key(n: int) -> str:
    """The key whose 32 bytes are all ``n`` (0-255; 0 is the all-zero key)."""
    return base64.b64encode(bytes([n]) * 32).decode()


def key(rank: int) -> str:
    """A key for ranks 0-254, never the all-zero one; also a valid X25519 private key."""
    return byte_key(rank + 1)


def wide_key(rank: int) -> str:
    """A key for ranks 0-65535: the rank's two bytes, repeated to 32."""
    return base64.b64encode(rank.to_bytes(2, "big") * 16).decode()


class FlakyFake(FakeDataplane):
    """Refuses the next ``failures`` plans, as a device being restarted would."""

    failures = 0

    async def apply(self, plan: Plan) -> None:
        if plan and self.failures:
            self.failures -= 1
            raise DataplaneError("UAPI /run/wireguard/vnet0.sock: Connection refused")
        await super().apply(plan)


LEASE_TTL_OF_A_TEST = 86_400
"""The TTL of ``create_leased``'s lease: no test outlives it (readers skip an entry
bound to no lease: docs/architecture.md, "Registry layout")."""


async def create_leased(registry: Registry, key: str, value: bytes) -> KeyValue | None:
    """``registry.create`` under a lease of its own, as every claim is made."""
    return await registry.create(key, value, await registry.grant(LEASE_TTL_OF_A_TEST))
