"""The relay's HTTP side (``registry.relay.app``) as a daemon's client sees it: a relay
of a memory registry on 127.0.0.1, read with ``EtcdRegistry`` (the registry contract
suite runs on it too: ``tests/contract``). Real time; every wait bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from vnetd.errors import RegistryUnavailable, WatchCompacted
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.memory import MemoryRegistry
from vnetd.registry.relay.app import RelayApp
from vnetd.registry.relay.service import run_relay

P = "/vnetd/m/members/"
BOUND = 10.0


@asynccontextmanager
async def relayed(
    upstream: MemoryRegistry, window: int = 100
) -> AsyncIterator[tuple[RelayApp, EtcdRegistry]]:
    async with trio.open_nursery() as nursery:
        relay = partial(run_relay, window_events=window)
        app = await nursery.start(relay, upstream, P, ["127.0.0.1:0"])
        client = EtcdRegistry(app.bound, timeout=2.0)
        try:
            yield app, client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(BOUND):
        while not condition():
            await trio.sleep(0.01)


async def next_batch_after(
    app: RelayApp, client: EtcdRegistry, start: int, then: Callable[[], None]
) -> None:
    """Open a watch from ``start``, do ``then`` once the relay serves it, read a batch."""
    with trio.fail_after(BOUND):
        async with client.watch(P, start) as batches:
            await until(lambda: app.watchers == 1)
            then()
            await batches.__anext__()


async def test_a_watch_from_before_the_window_is_answered_compacted() -> None:
    upstream = MemoryRegistry()
    async with relayed(upstream, window=2) as (app, client):
        for rank in range(5):
            await upstream.create(f"{P}{rank}", b"r")
        await until(lambda: len(app.cache.members) == 5)
        with trio.fail_after(BOUND), pytest.raises(WatchCompacted):
            async with client.watch(P, 2) as batches:
                await batches.__anext__()
        kvs, revision = await client.list_prefix(P)  # what the daemon does next
        assert len(kvs) == 5 and revision == app.cache.revision


@pytest.mark.parametrize(
    "moved", [pytest.param(5, id="etcd-went-on"), pytest.param(-3, id="etcd-was-reset")]
)
async def test_a_relist_ends_the_watches_it_serves_compacted(moved: int) -> None:
    """The events between two lists are unknown, whichever way the store moved."""
    upstream = MemoryRegistry()
    for rank in range(4):
        await upstream.create(f"{P}{rank}", b"r")
    async with relayed(upstream) as (app, client):
        _, revision = await client.list_prefix(P)

        def relisted() -> None:
            app.cache.replace([], revision + moved)
            app.changes.notify()

        with pytest.raises(WatchCompacted):
            await next_batch_after(app, client, revision + 1, relisted)


async def test_a_relay_that_lost_etcd_ends_its_watches_and_refuses_reads() -> None:
    upstream = MemoryRegistry()
    async with relayed(upstream) as (app, client):
        _, revision = await client.list_prefix(P)
        with pytest.raises(RegistryUnavailable):
            await next_batch_after(app, client, revision + 1, lambda: upstream.fail(True))
        await until(lambda: not app.cache.synced)
        with trio.fail_after(BOUND), pytest.raises(RegistryUnavailable):
            await client.list_prefix(P)


async def test_reads_outside_the_prefix_are_not_served() -> None:
    upstream = MemoryRegistry()
    await upstream.create("/vnetd/m/spec", b"{}")
    async with relayed(upstream) as (_app, client):
        with trio.fail_after(BOUND), pytest.raises(RegistryUnavailable, match="serves only"):
            await client.get("/vnetd/m/spec")
        with trio.fail_after(BOUND), pytest.raises(RegistryUnavailable, match="serves only"):
            await client.list_prefix("/vnetd/m/")


async def test_a_watch_from_after_the_relay_s_revision_is_confirmed_by_etcd_s() -> None:
    """A daemon that read etcd directly has seen revisions of other keys: the relay
    confirms its watch with etcd's revision, and serves the members' events after it."""
    upstream = MemoryRegistry()
    async with relayed(upstream) as (app, client):
        for i in range(3):
            await upstream.create(f"/vnetd/m/other/{i}", b"x")
        _, store = await upstream.list_prefix("/vnetd/m/other/")
        assert store > app.cache.revision + 1
        with trio.fail_after(BOUND):
            async with client.watch(P, store + 1) as batches:
                await upstream.create(f"{P}1", b"r")
                [event] = await batches.__anext__()
        assert (event.key, event.mod_revision) == (f"{P}1", store + 1)


async def test_the_metrics_say_what_the_relay_holds_and_serves() -> None:
    upstream = MemoryRegistry()
    await upstream.create(f"{P}0", b"r")
    async with relayed(upstream) as (app, _client):
        text = app.metrics().decode()
    assert "vnetd_relay_synced 1\n" in text
    assert "vnetd_relay_members 1\n" in text
    assert "vnetd_relay_watchers 0\n" in text
