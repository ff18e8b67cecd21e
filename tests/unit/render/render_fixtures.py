"""Specs, keys and members shared by the render tests (conftest.py holds the fixtures)."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from shared import create_leased
from shared import key as private_key

from vnetd.control.membership import encode_member, member_key
from vnetd.keys import public_key_of
from vnetd.model import KeyPair, Member
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, parse_spec

GOLDEN = Path(__file__).parent / "golden"
EXAMPLE = Path(__file__).parents[3] / "examples" / "mesh.toml"

LAB_TOML = """\
[mesh]
name = "lab"
size = 4
network = "10.250.0.0/24"
hostname = "lab-{rank}"
"""

LAB6_TOML = """\
[mesh]
name = "lab6"
size = 5
network = "fd00:250::/64"
hostname = "lab6-{rank}"
interface = "ovl0"
mtu = 1380
port = 51900
persistent_keepalive = 25
"""

DUAL_TOML = """\
[mesh]
name = "ds"
size = 3
network = "10.250.0.0/24"
network6 = "fd00:250::/64"
hostname = "ds-{rank}"
"""

BURST_TOML = """\
[mesh]
name = "flux"
size = 64
network = "10.250.0.0/24"
site_keepalive = 25

[registry]
endpoints = ["https://etcd-client:2379"]

[sites.a]
gateways = [0]

[sites.b]
gateways = [32, 33]
"""
"""Two sites: a runs ranks 0-31 (gateway 0), b runs 32-63 (gateways 32 and 33)."""

LAB = parse_spec(
    {"mesh": {"name": "lab", "size": 4, "network": "10.250.0.0/24", "hostname": "lab-{rank}"}}
)
LAB6 = parse_spec(
    {
        "mesh": {
            "name": "lab6",
            "size": 5,
            "network": "fd00:250::/64",
            "hostname": "lab6-{rank}",
            "interface": "ovl0",
            "mtu": 1380,
            "port": 51900,
            "persistent_keepalive": 25,
        }
    }
)

DUAL = parse_spec(tomllib.loads(DUAL_TOML))
"""A dual-stack mesh: IPv4 ``network`` (the primary) and IPv6 ``network6``."""


def key_pair(n: int) -> KeyPair:
    return KeyPair(private_key(n), public_key_of(private_key(n)))


def member(
    spec: MeshSpec, rank: int, key: int | None = None, endpoint: str | None = "auto"
) -> Member:
    """Rank ``rank`` registered with key number ``key`` (default: its rank)."""
    if endpoint == "auto":
        endpoint = (
            f"198.18.1.{rank + 1}:{spec.port}"
            if spec.network.version == 4
            else f"[2001:db8::{rank + 1}]:{spec.port}"
        )
    return Member(rank, key_pair(rank if key is None else key).public_key, endpoint, f"pod{rank}")


def memory_opener(
    spec: MeshSpec, members: Sequence[Member], bad: int = 0, fail: bool = False
) -> Callable[[Sequence[str]], AbstractAsyncContextManager[Registry]]:
    """An opener of a fresh ``MemoryRegistry`` holding ``members`` and ``bad`` broken entries."""

    @asynccontextmanager
    async def open_registry(endpoints: Sequence[str]) -> AsyncIterator[MemoryRegistry]:
        registry = MemoryRegistry()
        for m in members:
            await create_leased(registry, member_key(spec, m.rank), encode_member(m))
        for i in range(bad):
            await create_leased(registry, member_key(spec, spec.size + i), b"{}")
        if fail:
            registry.fail()
        yield registry

    return open_registry
