"""Read this host's WireGuard device over wireguard-go's UAPI socket (read-only).

Used by ``vnetd status`` (the device columns) and ``vnetd wait --reachable``
(the handshakes). One ``get`` on ``<wireguard-dir>/<interface>.sock``; the
socket is wireguard-go's, shared with the container that runs ``vnetd up``.

The answer to ``get`` carries the device's private key. It is turned into
the public key at once and dropped: no record here holds it, so nothing that
prints one of them can leak it (DESIGN invariant 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vnetd.dataplane.base import key_from_hex
from vnetd.dataplane.uapi import UapiClient, parse_peers
from vnetd.errors import DataplaneError
from vnetd.identity import public_key_of
from vnetd.model import DevicePeer

READ_TIMEOUT = 2.0
"""One UAPI request/response, seconds."""


@dataclass(frozen=True)
class LocalDevice:
    """What the device reports, minus its private key."""

    public_key: str | None
    """The device's own public key (None when it has no private key set)."""
    listen_port: int | None
    peers: dict[str, DevicePeer] = field(default_factory=dict)
    """The peers, keyed by base64 public key, with handshake time and counters."""


async def read_local_device(
    path: Path,
    timeout: float = READ_TIMEOUT,  # noqa: ASYNC109 (a per-request bound, as UapiClient's)
) -> LocalDevice:
    """One ``get`` on the UAPI socket at ``path``.

    Raises:
        DataplaneError: no socket there (the message says what to check),
            no answer within ``timeout`` s, or the device refused.
    """
    client = UapiClient(str(path), timeout=timeout)
    try:
        pairs = await client.get()
    except DataplaneError as exc:
        if isinstance(exc.__cause__, FileNotFoundError | ConnectionRefusedError):
            raise DataplaneError(
                f"no WireGuard device at {path} (is vnetd up running, and is "
                "--wireguard-dir the directory it shares?)"
            ) from None
        raise
    return LocalDevice(_public_key(pairs), _listen_port(pairs), parse_peers(pairs))


def _device_lines(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """The device-level ``key=value`` lines: those before the first peer."""
    lines: dict[str, str] = {}
    for key, value in pairs:
        if key == "public_key":
            break
        lines[key] = value
    return lines


def _public_key(pairs: list[tuple[str, str]]) -> str | None:
    private_hex = _device_lines(pairs).get("private_key", "")
    if not private_hex or set(private_hex) == {"0"}:
        return None
    try:
        return public_key_of(key_from_hex(private_hex))
    except ValueError:
        return None


def _listen_port(pairs: list[tuple[str, str]]) -> int | None:
    port = _device_lines(pairs).get("listen_port", "")
    return int(port) if port.isdigit() else None
