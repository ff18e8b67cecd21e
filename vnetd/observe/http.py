"""The daemon's HTTP endpoint: ``/healthz``, ``/readyz``, ``/metrics``, ``/status``.

hypercorn (its trio worker) does the HTTP; this module is a small ASGI
application that maps four GET paths to an ``Endpoints`` object. Routing
four fixed paths needs no framework. The endpoint is off unless a listen
address is configured (``[http] listen`` in the spec or ``--http-listen``),
and hypercorn is only imported then (~50 ms of a daemon's start otherwise).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

log = logging.getLogger("vnetd.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GRACEFUL_TIMEOUT = 1.0


@dataclass(frozen=True)
class Check:
    """The answer of a health or readiness check: 200 when ``ok``, else 503."""

    ok: bool
    detail: str


class Endpoints(Protocol):
    async def health(self) -> Check: ...

    async def ready(self) -> Check: ...

    async def metrics(self) -> bytes: ...

    async def status(self) -> dict[str, Any]: ...


class App:
    """The ASGI application over an ``Endpoints``."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", extra=[(b"allow", b"GET, HEAD")])
            return
        path = scope["path"]
        body_wanted = scope["method"] == "GET"
        if path in ("/healthz", "/readyz"):
            probe = self.endpoints.health if path == "/healthz" else self.endpoints.ready
            check = await probe()
            status = 200 if check.ok else 503
            await _respond(send, status, (check.detail + "\n").encode(), body=body_wanted)
        elif path == "/metrics":
            data = await self.endpoints.metrics()
            await _respond(send, 200, data, content_type=METRICS_CONTENT_TYPE, body=body_wanted)
        elif path == "/status":
            document = await self.endpoints.status()
            data = json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"
            await _respond(send, 200, data, content_type="application/json", body=body_wanted)
        else:
            await _respond(send, 404, b"not found: try /healthz /readyz /metrics /status\n")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(
    send: Send,
    status: int,
    data: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: list[tuple[bytes, bytes]] | None = None,
    body: bool = True,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data if body else b""})


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
