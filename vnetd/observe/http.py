"""The daemon's HTTP endpoint: ``/healthz``, ``/readyz``, ``/metrics``, ``/status``,
``/gatez``.

hypercorn (its trio worker) does the HTTP; this module is a small ASGI
application that maps five GET paths to an ``Endpoints`` object. Routing
five fixed paths needs no framework. The endpoint is off unless a listen
address is configured (``[http] listen`` in the spec or ``--http-listen``),
and hypercorn is only imported then (~50 ms of a daemon's start otherwise).

Bounded (docs/security.md, "The HTTP endpoint"): ``/status`` lists every member's
endpoint, key and instance, so it answers only clients on the loopback (the pod
itself: ``vnetd status`` beside the daemon, an exec'd ``curl``); a client from
elsewhere gets 403; so does ``/gatez`` (the MiniCluster's mesh gate, whose verdict
sets the probe service probing). ``/status`` and ``/metrics`` read the whole device and build
one row per rank, so each is built at most once per ``SHARED_FOR`` seconds, and
concurrent requests share that build instead of each making its own.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, Protocol
from urllib.parse import parse_qs

import trio

from vnetd.asgi import Receive, Scope, Send, lifespan, respond

log = logging.getLogger("vnetd.http")


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GRACEFUL_TIMEOUT = 1.0
DEFAULT_FANOUT = 2
"""flux-core's default ``tbon.fanout``, when ``/gatez`` is not told the tree's."""
MAX_FANOUT = 1 << 20
SHARED_FOR = 1.0
"""Seconds one build of ``/status`` or ``/metrics`` answers every request for."""


@dataclass(frozen=True)
class Check:
    """The answer of a health or readiness check: 200 when ``ok``, else 503."""

    ok: bool
    detail: str
    status: int | None = None
    """The HTTP status when it is neither 200 nor 503 (the gate's 409: waiting will not
    help)."""


class Endpoints(Protocol):
    async def health(self) -> Check: ...

    async def ready(self) -> Check: ...

    async def metrics(self) -> bytes: ...

    async def status(self) -> dict[str, Any]: ...

    async def gate(self, fanout: int, verdict: bool) -> Check: ...


class App:
    """The ASGI application over an ``Endpoints``."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self._status = Shared(self._status_bytes)
        self._metrics = Shared(endpoints.metrics)

    async def _status_bytes(self) -> bytes:
        document = await self.endpoints.status()
        return json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", extra=[(b"allow", b"GET, HEAD")])
            return
        path = scope["path"]
        body_wanted = scope["method"] == "GET"
        if path in ("/healthz", "/readyz"):
            probe = self.endpoints.health if path == "/healthz" else self.endpoints.ready
            check = await probe()
            status = 200 if check.ok else 503
            await respond(send, status, (check.detail + "\n").encode(), body=body_wanted)
        elif path == "/metrics":
            data = await self._metrics.get()
            await respond(send, 200, data, content_type=METRICS_CONTENT_TYPE, body=body_wanted)
        elif path in ("/status", "/gatez") and not from_loopback(scope):
            await respond(
                send, 403, f"{path} answers only from inside the pod (loopback)\n".encode()
            )
        elif path == "/gatez":
            await self._gate(scope, send, body_wanted)
        elif path == "/status":
            data = await self._status.get()
            await respond(send, 200, data, content_type="application/json", body=body_wanted)
        else:
            await respond(send, 404, b"not found: try /healthz /readyz /metrics /status /gatez\n")

    async def _gate(self, scope: Scope, send: Send, body_wanted: bool) -> None:
        """``/gatez?fanout=K[&verdict=1]``: the MiniCluster's mesh gate (``observe.gate``)."""
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        try:
            fanout = int(query.get("fanout", [str(DEFAULT_FANOUT)])[0])
        except ValueError:
            fanout = 0
        if not 1 <= fanout <= MAX_FANOUT:
            await respond(send, 400, f"fanout: give 1 to {MAX_FANOUT}\n".encode())
            return
        check = await self.endpoints.gate(fanout, query.get("verdict") == ["1"])
        status = check.status or (200 if check.ok else 503)
        await respond(send, status, (check.detail + "\n").encode(), body=body_wanted)


class Shared:
    """A value built at most once per ``SHARED_FOR`` s; concurrent callers wait for the
    one build in progress instead of starting their own."""

    def __init__(self, build: Callable[[], Awaitable[bytes]]) -> None:
        self._build = build
        self._lock = trio.Lock()
        self._value = b""
        self._built_at = -math.inf

    async def get(self) -> bytes:
        async with self._lock:
            if trio.current_time() - self._built_at >= SHARED_FOR:
                self._value = await self._build()
                self._built_at = trio.current_time()
            return self._value


def from_loopback(scope: Scope) -> bool:
    """Whether the request came from this host's loopback (a pod: its own containers)."""
    client = scope.get("client")
    if not client:
        return False
    try:
        return ip_address(str(client[0]).split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def serve_http(
    listen: str,
    endpoints: Endpoints,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the endpoints on ``listen`` (``host:port``) until cancelled.

    ``task_status.started`` receives the bound addresses (``port`` 0 picks a
    free one).

    Raises:
        OSError: the address cannot be bound (in use, not local).

    Cancellation: open connections get ``GRACEFUL_TIMEOUT`` seconds.
    """
    from hypercorn.config import Config  # only when serving (see the module doc)
    from hypercorn.trio import serve

    config = Config()
    config.bind = [listen]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.keep_alive_timeout = 5.0
    app = App(endpoints)
    await serve(app, config, mode="asgi", task_status=task_status)  # type: ignore[arg-type]
