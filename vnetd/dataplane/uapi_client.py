"""A client for wireguard-go's UAPI socket: one trio unix-socket connection per request.

The bytes on the wire are ``uapi_protocol``'s. Hand-written: there is no
maintained Python client for this protocol, and pyroute2's ``WireGuard``
only speaks the kernel's generic netlink family, which wireguard-go does not
have (see docs/architecture.md, data plane).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import trio

from vnetd.dataplane.uapi_protocol import (
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
    """One wireguard-go UAPI socket. Each call opens its own connection.

    Every call is bounded by ``timeout`` seconds and raises ``DataplaneError``
    on timeout, connection failure or a non-zero ``errno``.
    """

    def __init__(self, path: str, timeout: float = UAPI_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout

    async def get(self) -> Lines:
        """The device's state as ``(key, value)`` lines, in wire order."""
        return await self._request(GET_REQUEST)

    async def set(self, lines: Sequence[tuple[str, str]], within: float | None = None) -> None:
        """Send one ``set`` transaction, bounded by ``within`` seconds (default: the
        client's ``timeout``). Values are never echoed in errors."""
        await self._request(set_request(lines), within)

    async def _request(self, request: bytes, within: float | None = None) -> Lines:
        seconds = self.timeout if within is None else within
        try:
            with trio.fail_after(seconds):
                stream = await trio.open_unix_socket(self.path)
                async with stream:
                    await stream.send_all(request)
                    data = await _receive_response(stream)
        except trio.TooSlowError:
            raise DataplaneError(f"UAPI {self.path}: no answer within {seconds:g} s") from None
        except OSError as exc:
            raise DataplaneError(f"UAPI {self.path}: {exc.strerror or exc}") from exc
        return parse_response(self.path, data)


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
