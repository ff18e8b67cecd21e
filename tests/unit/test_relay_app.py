"""The relay's HTTP side (``registry.relay.app``) as a daemon's client sees it: a relay
of a memory registry on 127.0.0.1, read with ``EtcdRegistry`` (the registry contract
suite runs on it too: ``tests/contract``). Real time; every wait bounded."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from cryptography import x509
from tlscerts import TestCA

from vnetd.errors import RegistryUnavailable, SpecError, WatchCompacted
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.security import EtcdSecurity, RegistryAccessError
from vnetd.registry.memory import MemoryRegistry
from vnetd.registry.relay.app import RelayApp
from vnetd.registry.relay.service import run_relay
from vnetd.registry.relay.tls import RelayTls, keep_loaded, server_context

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


# --- HTTPS (``registry.relay.tls``) ---------------------------------------------------------


async def test_a_relay_serves_https_that_a_daemon_verifies_with_its_ca(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    files = ca.issue("relay", ips=("127.0.0.1",))
    upstream = MemoryRegistry()
    await upstream.create(f"{P}1", b"one")
    tls = RelayTls(files.cert, files.key)
    async with trio.open_nursery() as nursery:
        app = await nursery.start(partial(run_relay, tls=tls), upstream, P, ["127.0.0.1:0"])
        assert all(url.startswith("https://") for url in app.bound)
        trusted = EtcdRegistry(app.bound, timeout=2.0, security=EtcdSecurity(ca.ca_file))
        other = TestCA(tmp_path / "other")
        stranger = EtcdRegistry(app.bound, timeout=2.0, security=EtcdSecurity(other.ca_file))
        try:
            with trio.fail_after(BOUND):
                kvs, _ = await trusted.list_prefix(P)
                assert [kv.value for kv in kvs] == [b"one"]
                with pytest.raises(RegistryAccessError, match="certificate verify failed"):
                    await stranger.list_prefix(P)
        finally:
            await trusted.aclose()
            await stranger.aclose()
            nursery.cancel_scope.cancel()


async def test_a_relay_loads_its_renewed_certificate_without_a_restart(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    first = ca.issue("relay", ips=("127.0.0.1",))
    tls = RelayTls(tmp_path / "tls.crt", tmp_path / "tls.key")
    for source, target in ((first.cert, tls.cert_file), (first.key, tls.key_file)):
        target.write_bytes(source.read_bytes())
    context, loaded = server_context(tls)
    served = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(keep_loaded, every=0.05), context, tls, loaded)
        listeners = await nursery.start(
            partial(trio.serve_ssl_over_tcp, _serve_one(served), 0, context, host="127.0.0.1")
        )
        port = listeners[0].transport_listener.socket.getsockname()[1]
        was = _serial(first.cert)
        assert await _peer_serial(port, ca.ca_file) == was
        renewed = ca.issue("relay-2", ips=("127.0.0.1",))
        broken = b"-----BEGIN CERTIFICATE-----\nnot one\n"
        tls.cert_file.write_bytes(broken)  # caught half-written: the loaded pair stays
        await trio.sleep(0.2)
        assert await _peer_serial(port, ca.ca_file) == was
        # The new certificate before its key (copied by hand, cert first): a live context
        # given it would hold it without a key and fail every handshake.
        tls.cert_file.write_bytes(renewed.cert.read_bytes())
        await trio.sleep(0.2)
        assert await _peer_serial(port, ca.ca_file) == was
        tls.key_file.write_bytes(renewed.key.read_bytes())
        with trio.fail_after(BOUND):
            while await _peer_serial(port, ca.ca_file) != _serial(renewed.cert):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


def test_a_pair_that_does_not_load_stops_the_relay_with_one_line(tmp_path: Path) -> None:
    files = TestCA(tmp_path / "ca").issue("relay")
    other = TestCA(tmp_path / "ca2").issue("relay")
    with pytest.raises(SpecError, match=r"^--tls-cert .*: not a readable PEM certificate"):
        server_context(RelayTls(files.cert, other.key))
    with pytest.raises(SpecError, match="No such file"):
        server_context(RelayTls(tmp_path / "none.crt", files.key))


def _serve_one(served: list[int]) -> Callable[[trio.SSLStream[trio.SocketStream]], Awaitable[None]]:
    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with trio.move_on_after(BOUND):
            await stream.do_handshake()
            served.append(1)
        await trio.aclose_forcefully(stream)

    return handler


async def _peer_serial(port: int, ca_file: Path) -> int:
    """The serial number of the certificate a new TLS connection to ``port`` is shown."""
    client = ssl.create_default_context(cafile=str(ca_file))
    with trio.fail_after(BOUND):
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(tcp, client, server_hostname="127.0.0.1")
        try:
            await stream.do_handshake()
            der = stream.getpeercert(binary_form=True)
        finally:
            await trio.aclose_forcefully(stream)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _serial(cert_file: Path) -> int:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number
