"""wireguard-go's UAPI as text: the requests, the answers, and the lines of ``get`` and ``set``.

Pure: no trio, no sockets (``uapi_client`` sends these bytes). wireguard-go
listens on ``SOCKET_DIR/<ifname>.sock`` and speaks the cross-platform
configuration protocol: ``get=1`` or ``set=1`` followed by ``key=value``
lines and a blank line; the answer ends with ``errno=N`` and a blank line;
keys are hex on the wire. See docs/architecture.md (data plane).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from vnetd.dataplane.base import keepalive_of, key_from_hex, key_to_hex
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Plan

SOCKET_DIR = "/run/wireguard"
"""Where wireguard-go serves ``<interface>.sock`` (vnetd keeps its ``.log`` and ``.id`` there)."""

UPSTREAM_SOCKET_DIR = "/var" + SOCKET_DIR
"""The same directory as wireguard-go and ``wg`` spell it (``/var/run`` is a link to
``/run``): the ``--wireguard-dir`` default that ``vnetd status`` and ``vnetd wait`` show."""

GET_REQUEST = b"get=1\n\n"


def socket_path(interface: str, directory: str | os.PathLike[str] = SOCKET_DIR) -> str:
    """wireguard-go's UAPI socket for ``interface`` in ``directory``: ``<dir>/<interface>.sock``."""
    return os.path.join(directory, f"{interface}.sock")


Lines = list[tuple[str, str]]
"""``key=value`` lines as ``(key, value)`` pairs, in wire order."""

DeviceState = tuple[str | None, int | None, dict[str, DevicePeer]]
"""A device as read: private key (base64, None when unset), listen port, peers by public key."""


def set_request(lines: Sequence[tuple[str, str]]) -> bytes:
    """One ``set`` transaction. Values are never echoed in errors.

    Raises:
        DataplaneError: a key or value holds a line or ``=`` separator.
    """
    body = ["set=1\n"]
    for key, value in lines:
        if "\n" in key or "=" in key or "\n" in value:
            raise DataplaneError(f"UAPI line {key!r}: key or value contains a separator")
        body.append(f"{key}={value}\n")
    body.append("\n")
    return "".join(body).encode()


def response_complete(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds a whole answer (it ends with a blank line)."""
    return data.endswith(b"\n\n") or data == b"\n"


def parse_response(path: str, data: bytes) -> Lines:
    """A whole answer to its lines, without the final ``errno`` line.

    Raises:
        DataplaneError: no ``errno`` line, or a non-zero one (``path`` names the socket).
    """
    pairs: Lines = []
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


def parse_device(pairs: Sequence[tuple[str, str]]) -> DeviceState:
    """``get`` lines to (private key, listen port, peers), as ``parse_dump`` reads a kernel dump.

    The private key is base64, None when the device has none (all zeros).
    """
    device: dict[str, str] = {}
    for key, value in pairs:
        if key == "public_key":
            break
        device[key] = value
    private_hex = device.get("private_key", "")
    private_key = None
    if private_hex and set(private_hex) != {"0"}:
        try:
            private_key = key_from_hex(private_hex)
        except ValueError:
            private_key = None
    port = device.get("listen_port", "")
    return private_key, int(port) if port.isdigit() else None, parse_peers(pairs)


MAX_ADDS_PER_SET = 32
"""Peers one ``set`` adds at most. wireguard-go sends each added peer's first
handshake inside the ``set`` (``IpcSetOperation``: ``handlePostConfig`` ->
``SendKeepalive`` -> ``SendHandshakeInitiation`` -> ``SendBuffer``), and that send
blocks while the UDP socket's send buffer is full, so a big plan is applied in
several ``set`` s, each bounded (docs/architecture.md, reconciler)."""


def split_plan(plan: Plan, max_adds: int = MAX_ADDS_PER_SET) -> list[Plan]:
    """``plan`` as transactions of at most ``max_adds`` adds each, applied in order.

    The first carries every remove and update (so no address is ever on two
    peers) and the re-added peers first among the adds (a peer removed and
    added back stays out of the device no longer than it must); a plan of at
    most ``max_adds`` adds stays one transaction. Each add keeps its handshake.
    """
    removed = {peer.public_key for peer in plan.remove}
    adds = sorted(plan.add, key=lambda peer: peer.public_key not in removed)
    handshake = set(plan.handshake)
    chunks = [tuple(adds[i : i + max_adds]) for i in range(0, len(adds), max_adds)] or [()]
    added = {peer.public_key for peer in plan.add}
    others = tuple(key for key in plan.handshake if key not in added)
    return [
        Plan(
            remove=plan.remove if n == 0 else (),
            update=plan.update if n == 0 else (),
            add=chunk,
            handshake=tuple(peer.public_key for peer in chunk if peer.public_key in handshake)
            + (others if n == 0 else ()),
        )
        for n, chunk in enumerate(chunks)
    ]


def plan_lines(
    plan: Plan, persistent_keepalive: int = 0, preshared_key: str | None = None
) -> Lines:
    """One ``set`` transaction for ``plan``: removes, then updates, then adds.

    Never ``replace_peers``: only the named peers are touched. Adds also send
    ``replace_allowed_ips`` so re-adding an existing peer is exact, not a union,
    and the mesh's pre-shared key (base64) when there is one. A peer's own
    ``keepalive`` wins over ``persistent_keepalive``; a peer's held endpoint is
    not sent (the other side's handshake teaches it). A peer whose handshake the
    plan starts is added with its keepalive off: turned on, it would start the
    handshake inside this ``set``, before the peer's route is in; ``handshake_lines``
    turns it on after the routes.
    """
    lines: Lines = []
    started = set(plan.handshake)
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
        keepalive = 0 if peer.public_key in started else keepalive_of(peer, persistent_keepalive)
        lines.append(("persistent_keepalive_interval", str(keepalive)))
    return lines
