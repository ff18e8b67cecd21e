"""The userspace data plane: wireguard-go, configured over its UAPI socket.

wireguard-go listens on ``/run/wireguard/<ifname>.sock`` and speaks the
cross-platform configuration protocol: ``get=1`` or ``set=1`` followed by
``key=value`` lines and a blank line; the answer ends with ``errno=N`` and a
blank line; keys are hex on the wire. The client here is hand-written:
there is no maintained Python client for this protocol, and it is a tiny
line protocol that fits in a few dozen lines (pyroute2's ``WireGuard`` only
speaks the kernel's generic netlink family, which this device does not have).

The link, its address and the routes are ``vnetd.dataplane.link``'s job.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from vnetd.dataplane.base import DeviceConfig, key_from_hex, key_to_hex, route_changes
from vnetd.dataplane.link import (
    change_routes,
    configure_link,
    device_routes,
    remove_link,
    run_netlink,
)
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Plan

log = logging.getLogger("vnetd.dataplane")

SOCKET_DIR = "/run/wireguard"
UAPI_TIMEOUT = 5.0  # one request/response on the socket
START_TIMEOUT = 5.0  # wireguard-go start until its socket answers
STOP_GRACE = 5.0  # SIGTERM until SIGKILL
CLEANUP_DEADLINE = STOP_GRACE + 5.0
_MAX_RESPONSE = 64 * 1024 * 1024


# --- the UAPI client --------------------------------------------------------------------


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


def plan_lines(plan: Plan, persistent_keepalive: int = 0) -> list[tuple[str, str]]:
    """One ``set`` transaction for ``plan``: removes, then updates, then adds.

    Never ``replace_peers``: only the named peers are touched. Adds also send
    ``replace_allowed_ips`` so re-adding an existing peer is exact, not a union.
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
        if peer.endpoint is not None:
            lines.append(("endpoint", peer.endpoint))
        lines.append(("replace_allowed_ips", "true"))
        lines += [("allowed_ip", ip) for ip in peer.allowed_ips]
        if persistent_keepalive:
            lines.append(("persistent_keepalive_interval", str(persistent_keepalive)))
    return lines


# --- the data plane ---------------------------------------------------------------------


class UapiDataplane:
    """A running wireguard-go device. Create it with ``open_uapi_dataplane``."""

    def __init__(
        self, config: DeviceConfig, uapi: UapiClient, netns: str | None, index: int, pid: int
    ) -> None:
        self.config = config
        self.uapi = uapi
        self.netns = netns
        self.index = index
        self.pid = pid
        self.noprefixroute = True
        self._lock = trio.Lock()

    async def peers(self) -> dict[str, DevicePeer]:
        return parse_peers(await self.uapi.get())

    async def apply(self, plan: Plan) -> None:
        """Apply ``plan`` as one UAPI ``set`` transaction, then move the routes.

        wireguard-go applies the lines in order and stops at the first error,
        so a refused transaction may be partly applied; the next full resync
        heals it.

        Raises:
            DataplaneError: the device or the kernel refused the change.
        """
        if not plan:
            return
        lines = plan_lines(plan, self.config.persistent_keepalive)
        async with self._lock:
            start = trio.current_time()
            await self.uapi.set(lines)
            live = {ip for p in (await self.peers()).values() for ip in p.allowed_ips}
            gone, new = route_changes(plan, live)
            if gone or new:
                await run_netlink(lambda: change_routes(self.netns, self.index, gone, new))
            elapsed = (trio.current_time() - start) * 1000
        log.debug(
            "%s: applied %s (routes -%d +%d) in %.1f ms",
            self.config.interface,
            plan.describe(limit=16),
            len(gone),
            len(new),
            elapsed,
        )

    async def routes(self) -> set[str]:
        return await run_netlink(lambda: device_routes(self.netns, self.index))


def _command(config: DeviceConfig, netns: str | None, wireguard_go: str) -> list[str]:
    cmd = [wireguard_go, "-f", config.interface]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


async def _wait_for_socket(uapi: UapiClient, process: trio.Process, output: _LastLine) -> None:
    with trio.move_on_after(START_TIMEOUT):
        for _ in range(int(START_TIMEOUT / 0.02) + 1):
            if process.poll() is not None:
                await output.finished(0.5)
                raise DataplaneError(
                    f"wireguard-go exited at start with code {process.returncode}: {output.line}"
                )
            try:
                stream = await trio.open_unix_socket(uapi.path)
            except OSError:
                await trio.sleep(0.02)
                continue
            await stream.aclose()
            return
    raise DataplaneError(f"wireguard-go: {uapi.path} did not appear within {START_TIMEOUT:g} s")


class _LastLine:
    """Drains the child's output, keeping its last non-empty line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.line = ""
        self._done = trio.Event()

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        try:
            while chunk := await stream.receive_some(65536):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for raw in lines:
                    self._record(raw)
                buffer = buffer[-4096:]
            self._record(buffer)
        finally:
            self._done.set()

    def _record(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if text and not text.startswith(("┌", "│", "└")):  # the "use the kernel" banner
            self.line = text
            log.debug("%s: wireguard-go: %s", self.name, text)

    async def finished(self, within: float) -> None:
        with trio.move_on_after(within):
            await self._done.wait()


async def _spawn(config: DeviceConfig, netns: str | None, wireguard_go: str) -> trio.Process:
    path = f"{SOCKET_DIR}/{config.interface}.sock"
    if await _socket_answers(path):
        raise DataplaneError(f"{path}: another wireguard-go already serves this name")
    level = os.environ.get("VNETD_WIREGUARD_LOG", "error")  # "verbose" to debug handshakes
    env = dict(os.environ, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD="1", LOG_LEVEL=level)
    try:
        return await trio.lowlevel.open_process(
            _command(config, netns, wireguard_go),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        raise DataplaneError(f"wireguard-go: cannot start {wireguard_go!r}: {exc}") from exc


async def _socket_answers(path: str) -> bool:
    with trio.move_on_after(1.0):
        try:
            stream = await trio.open_unix_socket(path)
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


async def _bring_up(
    config: DeviceConfig, netns: str | None, process: trio.Process, output: _LastLine
) -> UapiDataplane:
    """Wait for the socket, set key and port, configure the link."""
    uapi = UapiClient(f"{SOCKET_DIR}/{config.interface}.sock")
    await _wait_for_socket(uapi, process, output)
    await uapi.set(
        [
            ("private_key", key_to_hex(config.private_key, "private_key")),
            ("listen_port", str(config.listen_port)),
        ]
    )
    index, noprefixroute = await run_netlink(lambda: configure_link(netns, config))
    dataplane = UapiDataplane(config, uapi, netns, index, process.pid)
    dataplane.noprefixroute = noprefixroute
    return dataplane


async def _supervise(process: trio.Process, output: _LastLine, interface: str) -> None:
    code = await process.wait()
    await output.finished(0.5)
    raise DataplaneError(
        f"wireguard-go for {interface} exited unexpectedly with code {code}: "
        f"{output.line or '(no output)'}"
    )


async def _stop(process: trio.Process, config: DeviceConfig, netns: str | None) -> None:
    """SIGTERM, wait, SIGKILL; then remove what the process leaves behind."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE):
            await process.wait()
        if process.poll() is None:
            log.warning(
                "%s: wireguard-go ignored SIGTERM; killing pid %d", config.interface, process.pid
            )
            process.kill()
            await process.wait()
    # A killed wireguard-go leaves its socket behind; the name was ours.
    with suppress(FileNotFoundError):
        os.unlink(f"{SOCKET_DIR}/{config.interface}.sock")
    try:
        # Bounded by the caller's cleanup deadline; a loaded machine can take
        # more than NETLINK_TIMEOUT to enter a namespace here.
        await run_netlink(lambda: remove_link(netns, config), timeout=CLEANUP_DEADLINE)
    except DataplaneError as exc:
        log.error("%s: could not remove link or routes: %s", config.interface, exc)


@asynccontextmanager
async def open_uapi_dataplane(
    config: DeviceConfig, *, netns: str | None = None, wireguard_go: str = "wireguard-go"
) -> AsyncIterator[UapiDataplane]:
    """Start wireguard-go for ``config.interface``, configure it, yield the device.

    The device is supervised in a nursery of its own: if wireguard-go exits
    while the block runs, the block is cancelled and ``DataplaneError`` (with
    the exit code and last output line) is raised. On exit wireguard-go gets
    SIGTERM, then SIGKILL after 5 s; the link and the unreachable route are
    removed.

    Args:
        config: the device.
        netns: run the device in this existing network namespace (tests only;
            the daemon runs inside its pod's namespace with ``None``).
        wireguard_go: the wireguard-go executable.

    Raises:
        DataplaneError: wireguard-go could not start or be configured, or died.

    Cancellation: cleanup runs shielded, bounded by ``CLEANUP_DEADLINE``.
    """
    started = trio.current_time()
    process = await _spawn(config, netns, wireguard_go)
    output = _LastLine(config.interface)
    try:
        async with trio.open_nursery() as nursery:
            assert process.stdout is not None
            nursery.start_soon(output.drain, process.stdout)
            dataplane = await _bring_up(config, netns, process, output)
            log.info(
                "%s: wireguard-go pid %d up in %.0f ms (address %s, mtu %d)",
                config.interface,
                process.pid,
                (trio.current_time() - started) * 1000,
                config.address,
                config.mtu,
            )
            nursery.start_soon(_supervise, process, output, config.interface)
            try:
                yield dataplane
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        with trio.CancelScope(shield=True) as cleanup:
            cleanup.deadline = trio.current_time() + CLEANUP_DEADLINE
            await _stop(process, config, netns)
        if cleanup.cancelled_caught:
            log.error(
                "%s: cleanup did not finish within %g s (pid %d)",
                config.interface,
                CLEANUP_DEADLINE,
                process.pid,
            )
