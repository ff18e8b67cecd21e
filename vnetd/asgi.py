"""What vnetd's two HTTP servers share of the ASGI protocol: its types, the lifespan
answer and a whole response (``observe.http``, the daemon's endpoint; ``registry.relay.app``,
the relay). Both run on hypercorn's trio worker; these are the few lines of the protocol
itself that each would otherwise write again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer the server's start-up and shutdown; nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def respond(
    send: Send,
    status: int,
    data: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: list[tuple[bytes, bytes]] | None = None,
    body: bool = True,
) -> None:
    """One whole response, never cached (every answer is the state of the moment);
    ``body`` False: the headers only (a HEAD)."""
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data if body else b""})
