"""wireguard-go's UAPI: the client, and the lines of ``get`` and ``set``.

wireguard-go listens on ``/run/wireguard/<ifname>.sock`` and speaks the
cross-platform configuration protocol: ``get=1`` or ``set=1`` followed by
``key=value`` lines and a blank line; the answer ends with ``errno=N`` and a
blank line; keys are hex on the wire. The client here is hand-written:
there is no maintained Python client for this protocol, and it is a tiny
line protocol that fits in a few dozen lines (pyroute2's ``WireGuard`` only
speaks the kernel's generic netlink family, which this device does not have).
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence
from typing import Any

import trio

from vnetd.dataplane.base import keepalive_of, key_from_hex, key_to_hex
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Plan

UAPI_TIMEOUT = 5.0  # one request/response on the socket
_MAX_RESPONSE = 64 * 1024 * 1024


class UapiClient:
    """One wireguard-go UAPI socket. Each call opens its own connection.

    Every call is bounded by ``timeout`` seconds and raises ``DataplaneError``
    on timeout, connection failure or a non-zero ``errno``.
    """

    def __init__(self, path: str, timeout: float = UAPI_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout

    async def get(self) -> list[tuple[str, str]]:
        """The device's state as ``(key, value)`` lines, in wire order."""
        return await self._request(b"get=1\n\n")

    async def set(self, lines: Sequence[tuple[str, str]]) -> None:
        """Send one ``set`` transaction. Values are never echoed in errors."""
        body = ["set=1\n"]
        for key, value in lines:
            if "\n" in key or "=" in key or "\n" in value:
                raise DataplaneError(f"UAPI line {key!r}: key or value contains a separator")
            body.append(f"{key}={value}\n")
        body.append("\n")
        await self._request("".join(body).encode())

    async def _request(self, request: bytes) -> list[tuple[str, str]]:
        try:
            with trio.fail_after(self.timeout):
                stream = await trio.open_unix_socket(self.path)
                async with stream:
                    await stream.send_all(request)
                    data = await _receive_response(stream)
        except trio.TooSlowError:
            raise DataplaneError(f"UAPI {self.path}: no answer within {self.timeout:g} s") from None
        except OSError as exc:
            raise DataplaneError(f"UAPI {self.path}: {exc.strerror or exc}") from exc
        return _parse_response(self.path, data)


async def _receive_response(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while not (data.endswith(b"\n\n") or data == b"\n"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise OSError(errno.ECONNRESET, "connection closed before errno line")
        data += chunk
        if len(data) > _MAX_RESPONSE:
            raise OSError(errno.EMSGSIZE, "response too large")
    return bytes(data)


def _parse_response(path: str, data: bytes) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for line in data.decode("utf-8", "replace").splitlines():
        if line:
            key, _, value = line.partition("=")
            pairs.append((key, value))
    if not pairs or pairs[-1][0] != "errno":
        raise DataplaneError(f"UAPI {path}: malformed answer (no errno line)")
    code = int(pairs[-1][1] or "0")
    if code != 0:
        raise DataplaneError(f"UAPI {path}: device refused the request: errno={code}")
    return pairs[:-1]


def parse_peers(pairs: Iterable[tuple[str, str]]) -> dict[str, DevicePeer]:
    """``get`` lines to ``DevicePeer`` records keyed by base64 public key."""
    peers: dict[str, DevicePeer] = {}
    current: dict[str, Any] | None = None

    def flush() -> None:
        if current is not None:
            current["allowed_ips"] = tuple(sorted(current["allowed_ips"]))
            peers[current["public_key"]] = DevicePeer(**current)

    for key, value in pairs:
        if key == "public_key":
            flush()
            current = {"public_key": key_from_hex(value), "allowed_ips": []}
        elif current is None:
            continue  # device-level keys
        elif key == "endpoint":
            current["endpoint"] = value
        elif key == "allowed_ip":
            current["allowed_ips"].append(value)
        elif key == "last_handshake_time_sec":
            current["last_handshake"] = current.get("last_handshake", 0.0) + int(value)
        elif key == "last_handshake_time_nsec":
            current["last_handshake"] = current.get("last_handshake", 0.0) + int(value) / 1e9
        elif key in ("rx_bytes", "tx_bytes"):
            current[key] = int(value)
    flush()
    return peers


def plan_lines(
    plan: Plan, persistent_keepalive: int = 0, preshared_key: str | None = None
) -> list[tuple[str, str]]:
    """One ``set`` transaction for ``plan``: removes, then updates, then adds.

    Never ``replace_peers``: only the named peers are touched. Adds also send
    ``replace_allowed_ips`` so re-adding an existing peer is exact, not a union,
    and the mesh's pre-shared key (base64) when there is one. A peer's own
    ``keepalive`` wins over ``persistent_keepalive``; a peer's held endpoint is
    not sent (the other side's handshake teaches it).
    """
    lines: list[tuple[str, str]] = []
    for peer in plan.remove:
        lines += [("public_key", key_to_hex(peer.public_key)), ("remove", "true")]
    for upd in plan.update:
        lines += [("public_key", key_to_hex(upd.public_key)), ("update_only", "true")]
        if upd.endpoint is not None:
            lines.append(("endpoint", upd.endpoint))
        if upd.allowed_ips is not None:
            lines.append(("replace_allowed_ips", "true"))
            lines += [("allowed_ip", ip) for ip in upd.allowed_ips]
    for peer in plan.add:
        lines.append(("public_key", key_to_hex(peer.public_key)))
        if preshared_key is not None:
            lines.append(("preshared_key", key_to_hex(preshared_key, "preshared_key")))
        if peer.endpoint is not None and not peer.endpoint_held:
            lines.append(("endpoint", peer.endpoint))
        lines.append(("replace_allowed_ips", "true"))
        lines += [("allowed_ip", ip) for ip in peer.allowed_ips]
        # Always written, 0 too: wireguard-go (0.0.20220316 and later) keeps the "keepalive
        # turned on" flag of the previous peer of a ``set`` until a peer writes this key,
        # so a peer added after one whose keepalive turned on would send a keepalive, and
        # start a handshake, at once (seen in the lab: a responder initiating).
        lines.append(
            ("persistent_keepalive_interval", str(keepalive_of(peer, persistent_keepalive)))
        )
    return lines
