"""``GrpcWatchRegistry``: ``EtcdRegistry`` whose member watch runs over etcd's native gRPC
(``[registry] watch = "grpc"``); lists, writes, leases and auth stay on the JSON gateway.

Why: etcd spends ~6 µs per delivered event on a gRPC watch and ~49 µs through its JSON
gateway (``bench/watch_fanout.py``), and etcd's ``grpc-proxy``, which coalesces identical
watches into one, serves gRPC only (``[registry] watch_endpoints`` names it).

grpcio has no trio support, so each stream is grpcio's sync API on a worker thread of its
own (the bench's measured ``grpc-trio`` mode): the thread iterates the call, each message
already decoded there (``grpc_codec``), and hands it to trio through a zero-size channel,
so the stream keeps gRPC's flow control. Closing cancels the call first (which ends the
thread's wait on the next message) and then waits for the thread: the worker never
outlives the watch, so none outlives the daemon (``to_thread`` with
``abandon_on_cancel=False``).

Semantics are the JSON watch's (``watch``): from a start revision, moved to the next
watch endpoint when its stream breaks or ends, resuming after the last event delivered;
a compacted start raises ``WatchCompacted`` (the watcher lists again), a cancel by etcd
or a stream that no endpoint keeps ``RegistryUnavailable``; a watch resumed past the
store's revision (a reset store) is refused as unavailable.

The quiet check differs, for etcd's grpc-proxy: its ``recvLoop``
(``server/proxy/grpcproxy/watch.go`` at v3.5.1) logs a ``progress_request`` as "not
supported request type" and drops it, and it serves no JSON gateway, so neither the
JSON watch's linearizable read nor a progress request can tell a live stream there. The
channel's HTTP/2 keepalive does instead: a ping every ``PING_EVERY`` s (above etcd's and
the proxy's default ``--grpc-keepalive-min-time``, 5 s, below which a server sends
GOAWAY) that must be answered within ``PING_TIMEOUT`` s, or the channel is closed and the
stream moves. It costs etcd no request, and tells a frozen member or proxy from a quiet
stream wherever the stream ends. ``progress_notify`` is still asked (the proxy passes
etcd's notifications on); the watch needs none. Streams are leader-required
(``hasleader`` metadata), as the JSON watch's.

TLS and client certificates are the registry's files (``EtcdSecurity``), auth tokens the
registry's (``tokens``): a token is asked of the same endpoint over the gateway (or, for
a watch endpoint that is not one of the registry's, a proxy, of its first endpoint:
etcd's simple tokens are per member, so watching through a proxy with auth on needs
etcd's JWT tokens) and sent as etcd's ``token`` metadata.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import trio

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import WATCH_MESSAGE_BYTES, b64
from vnetd.registry.etcd.grpc_codec import (
    WATCH_METHOD,
    WatchMessage,
    create_request,
    decode_response,
)
from vnetd.registry.etcd.security import EtcdSecurity, SharedTls, security_of
from vnetd.registry.etcd.transport import PERMISSION_DENIED, Refused
from vnetd.spec import RegistrySpec

log = logging.getLogger("vnetd.registry")

PING_EVERY = 10.0
"""Seconds between the channel's HTTP/2 pings (etcd's minimum: 5 s)."""
PING_TIMEOUT = 5.0
"""Seconds a ping may wait for its answer before the channel is closed."""


@dataclass(frozen=True)
class _Ended:
    why: str
    code: grpc.StatusCode | None = None


class GrpcWatchRegistry(EtcdRegistry):
    """An ``EtcdRegistry`` whose ``watch`` is etcd's gRPC ``Watch`` stream.

    Args:
        endpoints: etcd client URLs, for everything but the watch.
        watch_endpoints: where the watch goes (etcd members or a grpc-proxy), as
            URLs; empty: ``endpoints``.
        timeout: each call's bound, and the bound of a watch's confirmation.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        watch_endpoints: Sequence[str] = (),
        timeout: float = 5.0,
        security: EtcdSecurity | None = None,
        lease_ttl: int | None = None,
        shared_tls: SharedTls | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            timeout=timeout,
            security=security,
            lease_ttl=lease_ttl,
            shared_tls=shared_tls,
        )
        self._watch_endpoints = [url.rstrip("/") for url in watch_endpoints or endpoints]
        self._watch_timeout = timeout
        self._watch_security = security or EtcdSecurity()
        self._channels: dict[str, grpc.Channel] = {}
        self._next_watch = 0

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        try:
            async with trio.open_nursery() as nursery:
                stream = _GrpcStream(self, prefix, start_revision, nursery)
                try:
                    await stream.open()
                    yield stream
                finally:
                    with trio.CancelScope(shield=True):
                        await stream.aclose()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the consumer's own error, as itself
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    def watch_endpoints(self) -> list[str]:
        """The watch endpoints, from the one after the last that served a stream."""
        start = self._next_watch % len(self._watch_endpoints)
        return self._watch_endpoints[start:] + self._watch_endpoints[:start]

    def watch_failed(self, endpoint: str) -> None:
        """Start the next watch on the endpoint after ``endpoint``."""
        self._next_watch = self._watch_endpoints.index(endpoint) + 1

    def channel(self, endpoint: str) -> grpc.Channel:
        """The channel to ``endpoint`` (a URL), opened on first use."""
        found = self._channels.get(endpoint)
        if found is None:
            found = self._channels[endpoint] = _open_channel(endpoint, self._watch_security)
        return found

    def drop_channel(self, endpoint: str) -> None:
        """Close the channel to ``endpoint`` after it failed to connect: grpcio retries a
        failed channel with a backoff of up to two minutes, during which every call on
        it fails at once; the next watch opens a new one and connects now."""
        channel = self._channels.pop(endpoint, None)
        if channel is not None:
            channel.close()

    async def watch_metadata(self, endpoint: str) -> tuple[tuple[str, str], ...]:
        """The stream's metadata: leader required, and the auth token if a user is set."""
        token_from = endpoint if endpoint in self._endpoints else self._endpoints[0]
        headers = await self._tokens.headers(self._client, token_from)
        token = headers.get("Authorization")
        return (("hasleader", "true"),) + ((("token", token),) if token else ())

    def token_rejected(self, endpoint: str) -> None:
        self._tokens.forget(endpoint if endpoint in self._endpoints else self._endpoints[0])

    def refused(self, endpoint: str, ended: _Ended, prefix: str) -> RegistryError:
        """A refused or cancelled stream as the credential error that names the fix (a
        permission, no user given), else as unavailable (the watcher lists again)."""
        code = PERMISSION_DENIED if ended.code == grpc.StatusCode.PERMISSION_DENIED else None
        refusal = Refused(f"etcd watch on {endpoint}: {ended.why}", code)
        error = self._tokens.access_error(refusal, endpoint, {"key": b64(prefix)})
        if error is refusal:
            return RegistryUnavailable(f"etcd gRPC watch on {endpoint}: {ended.why}")
        return error

    @property
    def watch_timeout(self) -> float:
        return self._watch_timeout

    async def aclose(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        await super().aclose()


@asynccontextmanager
async def open_grpc_watch_registry(
    settings: RegistrySpec, *, shared_tls: SharedTls | None = None
) -> AsyncIterator[GrpcWatchRegistry]:
    """The registry ``settings`` name (``watch = "grpc"``), closed (shielded) on exit."""
    registry = GrpcWatchRegistry(
        settings.endpoints,
        watch_endpoints=settings.watch_endpoints,
        security=security_of(settings),
        lease_ttl=settings.lease_ttl,
        shared_tls=shared_tls,
    )
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True):
            await registry.aclose()


def _target(url: str) -> str:
    return url.removeprefix("https://").removeprefix("http://")


def _open_channel(url: str, security: EtcdSecurity) -> grpc.Channel:
    """A channel of its own (not grpcio's process-wide subchannel pool: a process that
    runs many daemons, as the benches do, would share one connection), with the
    keepalive pings that are the quiet check and the watch's message bound."""
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", WATCH_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(PING_EVERY * 1000)),
        ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 0),
    ]
    if not url.startswith("https://"):
        return grpc.insecure_channel(_target(url), options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(security.ca_file),
        private_key=_read(security.key_file),
        certificate_chain=_read(security.cert_file),
    )
    return grpc.secure_channel(_target(url), credentials, options=options)


def _read(path: Path | None) -> bytes | None:
    """A TLS file's bytes (None: none given); unreadable names its flag, as ``security``."""
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RegistryError(f"etcd TLS file {path}: cannot read: {exc.strerror}") from None


class _GrpcStream:
    """One watch: a gRPC call on a worker thread, moved between watch endpoints."""

    def __init__(
        self, registry: GrpcWatchRegistry, prefix: str, start_revision: int, nursery: trio.Nursery
    ) -> None:
        self._registry = registry
        self._prefix = prefix
        self._next_revision = start_revision
        self._nursery = nursery
        self._call: Any = None
        self._requests_done = threading.Event()
        self._pump: trio.CancelScope | None = None
        self._receive: trio.MemoryReceiveChannel[WatchMessage | _Ended] | None = None
        self._moves_without_message = 0
        self.endpoint = ""

    async def open(self) -> None:
        """Open a confirmed stream from ``_next_revision`` on the first endpoint that
        gives one.

        Raises:
            WatchCompacted: the start revision was compacted.
            RegistryUnavailable: no endpoint confirmed the watch.
        """
        failures: list[str] = []
        bound = self._registry.watch_timeout
        for endpoint in self._registry.watch_endpoints():
            first: WatchMessage | _Ended | None = None
            with trio.move_on_after(bound):
                first = await self._start(endpoint)
            self.endpoint = endpoint
            if isinstance(first, WatchMessage) and first.created:
                self._confirmed(first)
                return
            if first is None:
                failures.append(f"{endpoint}: no watch confirmation within {bound:g} s")
            else:
                failures.append(f"{endpoint}: {self._why_not(endpoint, first)}")
            await self.aclose()
            self._registry.watch_failed(endpoint)
        raise RegistryUnavailable(
            f"etcd gRPC watch failed on every endpoint: {'; '.join(failures)}"
        )

    async def _start(self, endpoint: str) -> WatchMessage | _Ended:
        """Start the call and its thread; the call's first message."""
        metadata = await self._registry.watch_metadata(endpoint)
        stream = self._registry.channel(endpoint).stream_stream(
            WATCH_METHOD,
            request_serializer=_identity,
            response_deserializer=decode_response,
        )
        self._requests_done = threading.Event()
        requests = _requests(create_request(self._prefix, self._next_revision), self._requests_done)
        self._call = stream(requests, metadata=metadata)
        send, self._receive = trio.open_memory_channel[WatchMessage | _Ended](0)
        self._pump = await self._nursery.start(_pump, self._call, send)
        return await self._receive.receive()

    def _why_not(self, endpoint: str, first: WatchMessage | _Ended) -> str:
        """Why a stream was not confirmed; raises what the caller must see at once."""
        if isinstance(first, WatchMessage):
            self._confirmed(first)  # a compaction or a cancel: raises
            return f"unexpected first message {first!r}"
        if first.code == grpc.StatusCode.UNAVAILABLE:
            self._registry.drop_channel(endpoint)
        if first.code == grpc.StatusCode.UNAUTHENTICATED or "invalid auth token" in first.why:
            self._registry.token_rejected(endpoint)
        if first.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            raise self._registry.refused(endpoint, first, self._prefix)
        return first.why

    def _confirmed(self, message: WatchMessage) -> None:
        """Check a stream's message for a compaction, a cancel or a reset store."""
        if message.compact_revision > 0:
            raise WatchCompacted(message.compact_revision)
        if message.canceled:
            reason = message.cancel_reason or "no reason given"
            if "invalid auth token" in reason:
                self._registry.token_rejected(self.endpoint)
            ended = _Ended(f"canceled: {reason}")
            raise self._registry.refused(self.endpoint, ended, self._prefix)
        if message.created and message.revision and self._next_revision > message.revision + 1:
            raise RegistryUnavailable(
                f"etcd watch from revision {self._next_revision}: the store is at revision "
                f"{message.revision} (it was reset); listing again"
            )

    async def aclose(self) -> None:
        """Cancel the call, then wait for its thread (bounded by the cancel)."""
        self._requests_done.set()
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        if self._receive is not None:
            self._receive.close()  # a thread still sending gets BrokenResourceError

    def __aiter__(self) -> _GrpcStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while True:
            assert self._receive is not None
            item = await self._receive.receive()
            if isinstance(item, _Ended):
                await self._move(item)
                continue
            self._confirmed(item)
            self._moves_without_message = 0
            if not item.events:
                continue  # a progress notification, or a confirmation after a move
            self._next_revision = max(self._next_revision, item.events[-1].mod_revision + 1)
            return item.events

    async def _move(self, ended: _Ended) -> None:
        """Resume on the next endpoint from the revision after the last event delivered."""
        old = self.endpoint
        if ended.code in (grpc.StatusCode.PERMISSION_DENIED,):
            raise self._registry.refused(old, ended, self._prefix)
        if ended.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise RegistryUnavailable(f"etcd gRPC watch on {old}: {ended.why}; listing again")
        self._registry.watch_failed(old)
        if ended.code == grpc.StatusCode.UNAVAILABLE:
            self._registry.drop_channel(old)
        self._moves_without_message += 1
        limit = max(2, len(self._registry.watch_endpoints()))
        if self._moves_without_message > limit:
            raise RegistryUnavailable(
                f"etcd gRPC watch on {old}: {ended.why}; no endpoint kept the stream"
            )
        await self.aclose()
        await self.open()  # RegistryUnavailable, WatchCompacted: to the consumer
        log.warning(
            "etcd gRPC watch on %s: %s; resumed on %s from revision %d",
            old,
            ended.why,
            self.endpoint,
            self._next_revision,
        )


def _identity(data: bytes) -> bytes:
    return data


def _requests(create: bytes, done: threading.Event) -> Iterator[bytes]:
    """The request side: the create request, then open until the stream closes (etcd
    cancels a watch whose request side ends)."""
    yield create
    done.wait()


async def _pump(
    call: Any,  # noqa: ANN401 - grpcio's call object is untyped
    send: trio.MemorySendChannel[WatchMessage | _Ended],
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the call's worker thread until the stream ends or the call is cancelled."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        limiter = trio.CapacityLimiter(1)  # a thread per stream, never queued behind others
        await trio.to_thread.run_sync(_drain, call, send, limiter=limiter)


def _drain(call: Any, send: trio.MemorySendChannel[WatchMessage | _Ended]) -> None:  # noqa: ANN401
    """The worker thread: each message to trio, then why the stream ended."""
    try:
        try:
            for message in call:
                trio.from_thread.run(send.send, message)
            ended = _Ended("the stream ended")
        except grpc.RpcError as exc:
            ended = _Ended(f"the stream broke: {exc.code().name}: {exc.details()}", exc.code())
        trio.from_thread.run(send.send, ended)
    except (trio.Cancelled, trio.RunFinishedError, trio.BrokenResourceError):
        return  # the watch is closing
    finally:
        call.cancel()
