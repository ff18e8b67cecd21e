"""Fixtures that run the registry contract suite against every implementation.

``backend`` is parametrized over ``memory``, ``etcd`` (a fresh etcd on
127.0.0.1 per test, via ``vnetd.lab.etcd.run_etcd``) and ``etcd-grpc`` (the same,
watched over native gRPC: ``GrpcWatchRegistry``). ``backend_clock`` gives
the in-memory backend virtual time (autojump) and etcd real time.

Without root or wireguard-go the wireguard-go dataplane cases skip; under
``CI`` (the variable set) they run and fail instead, as the e2e suite does
(``tests/e2e/conftest.py``): a CI machine without them is a broken setup.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from vnetd.lab.etcd import EtcdServer, run_etcd
from vnetd.registry.base import Registry
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.grpc_watch import GrpcWatchRegistry
from vnetd.registry.memory import MemoryRegistry

CALL_TIMEOUT = 2.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``CI``, drop the skip of the contract cases that need wireguard-go."""
    if not os.environ.get("CI"):
        return
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        item.own_markers[:] = [mark for mark in item.own_markers if not needs_wireguard_go(mark)]


def needs_wireguard_go(mark: pytest.Mark) -> bool:
    """A ``skipif`` whose reason is a missing wireguard-go (``needs_lab`` in test_dataplane)."""
    return mark.name == "skipif" and "wireguard-go" in str(mark.kwargs.get("reason", ""))


@dataclass
class Backend:
    """A registry plus the test-only controls its backend offers."""

    name: str
    registry: Registry
    compact: Callable[[int], Awaitable[None]]
    outage: Callable[[], Awaitable[None]]
    recover: Callable[[], Awaitable[None]]
    unreachable: Callable[[], Registry]


@pytest.fixture(params=["memory", "etcd", "etcd-grpc", "relay"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_clock(backend_name: str) -> trio.testing.MockClock | None:
    """Virtual time for the fake; etcd's leases run on real time."""
    return trio.testing.MockClock(autojump_threshold=0) if backend_name == "memory" else None


@pytest.fixture
async def backend(backend_name: str, tmp_path: Path) -> AsyncIterator[Backend]:
    if backend_name == "memory":
        yield _memory_backend()
        return
    if backend_name == "relay":
        async with _relay_backend() as relayed:
            yield relayed
        return
    async with run_etcd(tmp_path / "etcd") as server:
        registry = _etcd_registry(backend_name, [server.url])
        try:
            yield _etcd_backend(server, registry)
        finally:
            await registry.aclose()


@pytest.fixture
def registry(backend: Backend) -> Registry:
    return backend.registry


def _memory_backend() -> Backend:
    registry = MemoryRegistry()

    async def compact(revision: int) -> None:
        registry.compact(revision)

    async def outage() -> None:
        registry.fail(True)

    async def recover() -> None:
        registry.fail(False)

    def unreachable() -> Registry:
        down = MemoryRegistry()
        down.fail(True)
        return down

    return Backend("memory", registry, compact, outage, recover, unreachable)


RELAYED = "m/"
"""The prefix the relay backend's relay serves; reads of others go to the registry."""


@asynccontextmanager
async def _relay_backend() -> AsyncIterator[Backend]:
    """Writes to a memory registry (real time), reads of ``RELAYED`` through a relay
    of it on 127.0.0.1 (``registry.relay``), as a daemon with ``[registry] relays``."""
    from vnetd.registry.relay.reads import RelayedRegistry
    from vnetd.registry.relay.service import run_relay

    memory = _memory_backend()
    upstream = memory.registry
    async with trio.open_nursery() as nursery:
        app = await nursery.start(run_relay, upstream, RELAYED, ["127.0.0.1:0"])
        relays = EtcdRegistry([app.bound[0]], timeout=CALL_TIMEOUT)
        registry = RelayedRegistry(upstream, relays, lambda prefix: prefix == RELAYED)
        try:
            yield Backend(
                "relay", registry, memory.compact, memory.outage, memory.recover,
                memory.unreachable,
            )  # fmt: skip
        finally:
            await relays.aclose()
            nursery.cancel_scope.cancel()


def _etcd_registry(name: str, urls: list[str]) -> EtcdRegistry:
    if name == "etcd-grpc":
        return GrpcWatchRegistry(urls, timeout=CALL_TIMEOUT)
    return EtcdRegistry(urls, timeout=CALL_TIMEOUT)


def _etcd_backend(server: EtcdServer, registry: EtcdRegistry) -> Backend:
    async def compact(revision: int) -> None:
        await compact_etcd(server.url, revision)

    def unreachable() -> Registry:
        kind = "etcd-grpc" if isinstance(registry, GrpcWatchRegistry) else "etcd"
        return _etcd_registry(kind, ["http://127.0.0.1:1"])

    return Backend("etcd", registry, compact, server.stop, server.start, unreachable)


async def compact_etcd(url: str, revision: int) -> None:
    """Compact etcd's history up to ``revision`` (test helper; loopback only)."""
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
        response = await client.post(f"{url}/v3/kv/compaction", json={"revision": str(revision)})
        response.raise_for_status()
