"""A client for wireguard-go's UAPI socket over trio unix-socket connections.

wireguard-go answers requests on one connection one after another until the
client closes it (``IpcHandle``), so the data plane keeps one open
(``keep_open``): opening a unix socket costs the client more CPU than a small
``set`` does (``bench/uapi_cost.py``, one peer's endpoint updated on a
device of 1023 peers, median of 100 on the 2-core lab host: 0.31 ms of client
CPU and 0.36 ms wall on a new connection, 0.14 ms and 0.15 ms on a kept
one). After a refused request wireguard-go may read the rest of it as
new requests and close the connection, so any failure drops it and the next
request opens another.

The bytes on the wire are ``uapi_protocol``'s. Hand-written: there is no
maintained Python client for this protocol, and pyroute2's ``WireGuard``
only speaks the kernel's generic netlink family, which wireguard-go does not
have (see docs/architecture.md, data plane).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import trio

from vnetd.dataplane.codec.uapi_protocol import (
    GET_REQUEST,
    Lines,
    parse_response,
    response_complete,
    set_request,
)
from vnetd.errors import DataplaneError

UAPI_TIMEOUT = 5.0  # one request/response on the socket
SEND_ALLOWANCE = 0.5
"""Seconds a ``set`` may take longer per peer it adds: wireguard-go sends that peer's
first handshake within the ``set``, and a send waits while the UDP socket's buffer is
full (0.4-0.5 s each measured with ~550 peers' handshakes queued on unresolved
neighbours; bench/uapi_handshake.py)."""
_MAX_RESPONSE = 64 * 1024 * 1024


class UapiClient:
    """One wireguard-go UAPI socket.

    Each call opens its own connection, or with ``keep_open`` reuses one until a
    call fails, is cancelled or ``close`` is called (then the next call opens a
    new one). Calls are served one at a time.

    Every call is bounded by ``timeout`` seconds and raises ``DataplaneError``
    on timeout, connection failure or a non-zero ``errno``.
    """

    def __init__(self, path: str, timeout: float = UAPI_TIMEOUT, keep_open: bool = False) -> None:
        self.path = path
        self.timeout = timeout
        self.keep_open = keep_open
        self.connections = 0
        """Connections opened so far."""
        self._stream: trio.SocketStream | None = None
        self._lock = trio.StrictFIFOLock()

    async def get(self) -> Lines:
        """The device's state as ``(key, value)`` lines, in wire order."""
        return await self._request(GET_REQUEST)

    async def set(self, lines: Sequence[tuple[str, str]], within: float | None = None) -> None:
        """Send one ``set`` transaction, bounded by ``within`` seconds (default: the
        client's ``timeout``). Values are never echoed in errors."""
        await self._request(set_request(lines), within)

    def close(self) -> None:
        """Close the kept connection, if any (a wireguard-go restart, the device's end)."""
        if self._stream is not None:
            self._stream.socket.close()
            self._stream = None

    async def _request(self, request: bytes, within: float | None = None) -> Lines:
        seconds = self.timeout if within is None else within
        async with self._lock:
            try:
                with trio.fail_after(seconds):
                    return await self._exchange(request)
            except trio.TooSlowError:
                raise DataplaneError(f"UAPI {self.path}: no answer within {seconds:g} s") from None
            except trio.BrokenResourceError as exc:  # trio's name for a send or receive's OSError
                cause = exc.__cause__
                why = cause.strerror if isinstance(cause, OSError) and cause.strerror else exc
                raise DataplaneError(f"UAPI {self.path}: connection lost: {why}") from exc
            except OSError as exc:
                raise DataplaneError(f"UAPI {self.path}: {exc.strerror or exc}") from exc

    async def _exchange(self, request: bytes) -> Lines:
        """Send ``request`` and read its answer on the kept or a new connection."""
        if self._stream is None:
            self._stream = await trio.open_unix_socket(self.path)
            self.connections += 1
        try:
            await self._stream.send_all(request)
            lines = parse_response(self.path, await _receive_response(self._stream))
        except BaseException:
            self.close()  # its state is unknown: a partial answer, or a refused request
            raise
        if not self.keep_open:
            self.close()
        return lines


async def _receive_response(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while not response_complete(data):
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise OSError(errno.ECONNRESET, "connection closed before errno line")
        data += chunk
        if len(data) > _MAX_RESPONSE:
            raise OSError(errno.EMSGSIZE, "response too large")
    return bytes(data)
