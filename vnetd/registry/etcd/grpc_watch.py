"""``GrpcWatchRegistry``: ``EtcdRegistry`` whose member watch runs over etcd's native gRPC
(``[registry] watch = "grpc"``); lists, writes, leases and auth stay on the JSON gateway.

Why: etcd spends ~6 µs per delivered event on a gRPC watch and ~49 µs through its JSON
gateway (``bench/watch_fanout.py``), and etcd's ``grpc-proxy``, which coalesces identical
watches into one, serves gRPC only (``[registry] watch_endpoints`` names it).

The stream itself (a worker thread per call, its resume and its checks) is
``grpc_stream``'s; this module holds the channels, the credentials and the choice of
endpoint.

The quiet check differs on etcd's grpc-proxy: its ``recvLoop``
(``server/proxy/grpcproxy/watch.go`` at v3.5.1) logs a ``progress_request`` as "not
supported request type" and drops it, and it serves no JSON gateway, so neither the JSON
watch's linearizable read nor a progress request can tell a live stream there. The
channel's HTTP/2 keepalive does instead: a ping every ``PING_EVERY`` s that must be
answered within ``PING_TIMEOUT`` s (grpcio 1.85 waits ``grpc.http2.ping_timeout_ms``, 60 s
by default, whatever ``keepalive_timeout_ms`` says: both are set), or the channel is
closed and the stream moves (``tests/contract/test_grpc_stream.py``: a frozen proxy is
left within 15 s). ``PING_EVERY`` is above etcd's and the 3.5 proxy's
``--grpc-keepalive-min-time`` (5 s), below which a server answers GOAWAY; the 3.4 proxy
sets none, so grpc-go's 5 min would apply to a stream that carries no data between pings
(not seen in the lab, whose etcd notifies progress every 2 s: data resets the count;
grpcio then doubles its interval). It costs etcd no request. ``progress_notify`` is
still asked (the proxy passes etcd's notifications on, and they space the checks on a
member as the JSON watch's). Streams are leader-required (``hasleader`` metadata), as
the JSON watch's.

TLS and client certificates are the registry's files (``EtcdSecurity``), auth tokens the
registry's (``tokens``): a token is asked of the same endpoint over the gateway (or, for
a watch endpoint that is not one of the registry's, a proxy, of its first endpoint:
etcd's simple tokens are per member, so watching through a proxy with auth on needs
etcd's JWT tokens) and sent as etcd's ``token`` metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import trio

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.endpoints import EndpointOrder
from vnetd.registry.etcd.gateway import WATCH_MESSAGE_BYTES, b64
from vnetd.registry.etcd.grpc_stream import Ended, GrpcStream
from vnetd.registry.etcd.security import EtcdSecurity, SharedTls, security_of
from vnetd.registry.etcd.transport import PERMISSION_DENIED, Refused
from vnetd.spec import RegistrySpec

PING_EVERY = 10.0
"""Seconds between the channel's HTTP/2 pings (etcd's minimum: 5 s)."""
PING_TIMEOUT = 5.0
"""Seconds a ping may wait for its answer before the channel is closed."""


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
        urls = [url.rstrip("/") for url in watch_endpoints or endpoints]
        self._watch_order = self._order
        """The watch's order among its endpoints: the registry's own when they are its
        members, so a member its calls found failed is tried last (with each attempt's
        bound, ``endpoints``), else the proxies' own."""
        if urls != self._endpoints:
            self._watch_order = EndpointOrder(urls, timeout)
        self._watch_security = security or EtcdSecurity()
        self._channels: dict[str, grpc.Channel] = {}

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        try:
            async with trio.open_nursery() as nursery:
                stream = GrpcStream(self, prefix, start_revision, nursery)
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

    def watch_attempts(self) -> list[tuple[str, float]]:
        """(endpoint, bound) of each attempt to open a watch (``endpoints``)."""
        return self._watch_order.attempts()

    @property
    def watch_endpoint_count(self) -> int:
        return len(self._watch_order.endpoints)

    def is_member(self, endpoint: str) -> bool:
        return endpoint in self._endpoints

    def watch_failed(self, endpoint: str) -> None:
        """Try ``endpoint`` last for a while; open its next stream on a new channel."""
        self._watch_order.failed(endpoint)
        self.drop_channel(endpoint)

    def watch_answered(self, endpoint: str) -> None:
        self._watch_order.answered(endpoint)

    def channel(self, endpoint: str) -> grpc.Channel:
        """The channel to ``endpoint`` (a URL), opened on first use."""
        found = self._channels.get(endpoint)
        if found is None:
            found = self._channels[endpoint] = _open_channel(endpoint, self._watch_security)
        return found

    def drop_channel(self, endpoint: str) -> None:
        """Close the channel to ``endpoint`` after a stream on it failed: grpcio retries a
        failed channel with a backoff of up to two minutes, during which every call on
        it fails at once, and a channel to a frozen member waits on it; the next watch
        opens a new one and connects now."""
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

    def refused(self, endpoint: str, ended: Ended, prefix: str) -> RegistryError:
        """A refused or cancelled stream as the credential error that names the fix (a
        permission, no user given), else as unavailable (the watcher lists again)."""
        code = PERMISSION_DENIED if ended.code == grpc.StatusCode.PERMISSION_DENIED else None
        refusal = Refused(f"etcd watch on {endpoint}: {ended.why}", code)
        error = self._tokens.access_error(refusal, endpoint, {"key": b64(prefix)})
        if error is refusal:
            return RegistryUnavailable(f"etcd gRPC watch on {endpoint}: {ended.why}")
        return error

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
        ("grpc.http2.ping_timeout_ms", int(PING_TIMEOUT * 1000)),  # grpcio 1.85's own: 60 s
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
