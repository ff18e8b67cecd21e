"""wireguard-go as a supervised process: one we start, or one a previous vnetd left running.

wireguard-go serves one interface and listens on ``/run/wireguard/<if>.sock``.
A daemon that is SIGKILLed leaves its wireguard-go running (the device keeps
forwarding); a restarted daemon that finds that socket answering can adopt
the process instead of replacing it, which keeps every session. The socket's
peer credentials (``SO_PEERCRED``) name the process that listens, and a pidfd
on it tells when it exits, child or not.

wireguard-go's output goes to ``/run/wireguard/<if>.log`` (truncated at each
start), not to a pipe: a Go program whose stdout is a pipe with no reader dies
of SIGPIPE at its next log line, so an orphan writing to its dead daemon's pipe
would not survive its first error. The file outlives the daemon like the
socket does, and its last line explains an exit. With the default
``LOG_LEVEL=error`` it stays small; ``VNETD_WIREGUARD_LOG=verbose`` makes it
grow with traffic.

Each fresh start also writes a new random device id to ``/run/wireguard/<if>.id``;
an adopted wireguard-go keeps the id written when it was started. The daemon
registers it with its key, so peers can tell a wireguard-go restarted with the
same key (it has lost every session) from the same one adopted (it has not).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import select
import signal
import socket
import stat
import struct
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from types import MappingProxyType

import trio

from vnetd.dataplane.base import DEFAULT_WIREGUARD_LOG
from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR, socket_path
from vnetd.errors import DataplaneError

log = logging.getLogger("vnetd.dataplane")

START_TIMEOUT = 5.0  # wireguard-go start until its socket answers
SOCKET_POLL = 0.005  # between tries while it starts (a refused connect costs microseconds)
PROBE_TIMEOUT = 1.0  # connecting to an existing socket
STOP_GRACE = 5.0  # SIGTERM until SIGKILL
KILL_WAIT = 2.0  # SIGKILL until the exit is seen
_TAIL = 8192  # bytes of output read for the last line
_BANNER = ("┌", "│", "└")  # wireguard-go's "use the kernel module" box


def output_path(interface: str) -> str:
    return f"{SOCKET_DIR}/{interface}.log"


def device_id_path(interface: str) -> str:
    return f"{SOCKET_DIR}/{interface}.id"


_DEVICE_ID = re.compile(r"[0-9a-f]{16}")


def write_device_id(interface: str) -> str:
    """A new random device id, written next to the socket; returns it.

    Raises:
        DataplaneError: the file cannot be written.
    """
    device_id = secrets.token_hex(8)
    path = device_id_path(interface)
    try:
        os.makedirs(SOCKET_DIR, exist_ok=True)
        with open(path, "w", encoding="ascii") as f:
            f.write(device_id + "\n")
    except OSError as exc:
        raise DataplaneError(f"{path}: {exc.strerror or exc}") from exc
    return device_id


def read_device_id(interface: str) -> str | None:
    """The device id written when the running wireguard-go was started; None if there
    is none (or it is not one vnetd wrote)."""
    try:
        with open(device_id_path(interface), encoding="ascii", errors="replace") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return text if _DEVICE_ID.fullmatch(text) else None


class WireguardGo:
    """A running wireguard-go: our child, or ``adopted`` from a previous run.

    Get one from ``start_wireguard_go`` or ``probe_socket``.
    """

    def __init__(
        self, interface: str, pid: int, *, process: trio.Process | None, pidfd: int | None
    ) -> None:
        self.interface = interface
        self.pid = pid
        self.device_id = ""
        """Names this device instance; see the module doc."""
        self._process = process
        self._pidfd = pidfd
        self._exit: int | None = None
        self._exited = process is None and pidfd is None

    @property
    def adopted(self) -> bool:
        return self._process is None

    def running(self) -> bool:
        if self._exited:
            return False
        if self._process is not None:
            return self._process.poll() is None
        return not _pidfd_ready(self._pidfd)

    async def wait(self) -> int | None:
        """Wait for the exit; its code (negative: a signal), None when not knowable.

        An adopted process is not our child: its code is read from /proc while
        it is a zombie, and is unknown once its parent has reaped it.
        """
        if self._process is not None:
            self._exit = await self._process.wait()
        elif self._pidfd is not None and not self._exited:
            await trio.lowlevel.wait_readable(self._pidfd)
            self._exit = _zombie_exit_code(self.pid)
        self._exited = True
        return self._exit

    def send_signal(self, sig: int) -> None:
        if not self.running():
            return
        if self._process is not None:
            self._process.send_signal(sig)
        elif self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE`` s; bounded."""
        if self.running():
            self.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_GRACE):
                await self.wait()
        if self.running():
            log.warning(
                "%s: wireguard-go pid %d ignored SIGTERM; killing it", self.interface, self.pid
            )
            self.send_signal(signal.SIGKILL)
            with trio.move_on_after(KILL_WAIT):
                await self.wait()
        self.close()

    def close(self) -> None:
        """Release the pidfd (the process itself is left alone)."""
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
            self._exited = True

    def last_line(self) -> str:
        """The last line wireguard-go wrote (its output file), '' if none."""
        try:
            with open(output_path(self.interface), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _TAIL))
                tail = f.read()
        except OSError:
            return ""
        for raw in reversed(tail.splitlines()):
            text = raw.decode("utf-8", "replace").strip()
            if text and not text.startswith(_BANNER):
                return text
        return ""


def _pidfd_ready(pidfd: int | None) -> bool:
    """A pidfd polls readable once its process has exited."""
    if pidfd is None:
        return True
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _zombie_exit_code(pid: int) -> int | None:
    """The wait status of an exited, not yet reaped process (proc(5): stat field 52)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


# --- an existing socket -------------------------------------------------------------------


@dataclass
class SocketProbe:
    """What answers on an interface's UAPI socket.

    ``state`` is ``absent`` (no file), ``stale`` (a socket file nobody listens
    on) or ``answers``; then ``pid`` is the listener's (0 when it runs in a PID
    namespace we cannot see) and ``process`` a handle on it, to adopt or
    ``close``.
    """

    path: str
    state: str
    pid: int = 0
    process: WireguardGo | None = field(default=None, repr=False)


async def probe_socket(interface: str) -> SocketProbe:
    """Connect to the interface's socket once and say who listens.

    Raises:
        DataplaneError: the path is not a socket, or connecting failed otherwise.
    """
    path = socket_path(interface)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            with trio.fail_after(PROBE_TIMEOUT):
                await sock.connect(path)
        except FileNotFoundError:
            return SocketProbe(path, "absent")
        except ConnectionRefusedError:
            return SocketProbe(path, _refused_kind(path))
        except trio.TooSlowError:
            raise DataplaneError(f"{path}: no answer within {PROBE_TIMEOUT:g} s") from None
        except OSError as exc:
            raise DataplaneError(f"{path}: {exc.strerror or exc}") from exc
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        process = None
        if pid > 0:
            # Opened while the connection is up, so the pidfd is the listener's.
            with suppress(ProcessLookupError):
                process = WireguardGo(interface, pid, process=None, pidfd=os.pidfd_open(pid))
        return SocketProbe(path, "answers", pid, process)


def _refused_kind(path: str) -> str:
    """``stale`` for a socket file nobody listens on; refuse anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "absent"  # removed meanwhile
    if not stat.S_ISSOCK(mode):
        raise DataplaneError(
            f"{path} exists and is not a socket; remove it or choose another name "
            "with [mesh] interface"
        )
    return "stale"


def remove_stale(path: str) -> None:
    """Unlink a socket file nobody listens on (a killed wireguard-go leaves it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --- starting one -------------------------------------------------------------------------


def _command(interface: str, netns: str | None, executable: str) -> list[str]:
    cmd = [executable, "-f", interface]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def _open_output(interface: str) -> int:
    """The output file, truncated (a small create on tmpfs)."""
    os.makedirs(SOCKET_DIR, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    return os.open(output_path(interface), flags, 0o600)


async def start_wireguard_go(
    interface: str,
    netns: str | None,
    executable: str,
    log_level: str = DEFAULT_WIREGUARD_LOG,
    child_env: Mapping[str, str] = MappingProxyType({}),
) -> WireguardGo:
    """Start ``wireguard-go -f <interface>`` and wait until its socket answers.

    It runs with ``child_env`` (the daemon's, ``DeviceConfig.child_env``) and
    ``LOG_LEVEL=log_level`` ("verbose" to debug handshakes), and the variable that
    lets it run where the kernel has WireGuard.

    Raises:
        DataplaneError: it could not start, exited, or its socket did not
            appear within ``START_TIMEOUT`` s (it is then killed).
    """
    env = dict(child_env, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD="1", LOG_LEVEL=log_level)
    try:
        output = _open_output(interface)
    except OSError as exc:
        raise DataplaneError(f"{output_path(interface)}: {exc.strerror or exc}") from exc
    try:
        device_id = write_device_id(interface)  # before the start: never an old id on a new one
    except DataplaneError:
        os.close(output)
        raise
    try:
        process = await trio.lowlevel.open_process(
            _command(interface, netns, executable),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        raise DataplaneError(f"wireguard-go: cannot start {executable!r}: {exc}") from exc
    finally:
        os.close(output)
    wg = WireguardGo(interface, process.pid, process=process, pidfd=None)
    wg.device_id = device_id
    try:
        await _wait_for_socket(wg)
    except BaseException:
        with trio.CancelScope(shield=True):
            await wg.stop()
        raise
    return wg


async def _wait_for_socket(wg: WireguardGo) -> None:
    path = socket_path(wg.interface)
    with trio.move_on_after(START_TIMEOUT):
        while True:
            if not wg.running():
                code = await wg.wait()
                raise DataplaneError(
                    f"wireguard-go exited at start with code {code}: "
                    f"{wg.last_line() or '(no output)'}"
                )
            try:
                stream = await trio.open_unix_socket(path)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                    raise DataplaneError(f"{path}: {exc.strerror or exc}") from exc
                await trio.sleep(SOCKET_POLL)
                continue
            await stream.aclose()
            return
    raise DataplaneError(f"wireguard-go: {path} did not appear within {START_TIMEOUT:g} s")


# --- restarts -----------------------------------------------------------------------------


class RestartBudget:
    """At most ``limit`` restarts within ``window`` s: the first at once, then backing off.

    ``first_delay`` doubles per restart in the window up to ``max_delay``, so a
    wireguard-go that dies at start is tried ``limit`` times in about 8 s and
    then given up on, instead of spinning.
    """

    def __init__(
        self,
        limit: int = 5,
        window: float = 60.0,
        first_delay: float = 0.5,
        max_delay: float = 4.0,
    ) -> None:
        self.limit = limit
        self.window = window
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._times: list[float] = []

    def next_delay(self, now: float) -> float | None:
        """The delay before the next restart, or None once the budget is spent."""
        self._times = [t for t in self._times if now - t < self.window]
        if len(self._times) >= self.limit:
            return None
        recent = len(self._times)
        self._times.append(now)
        if recent == 0:
            return 0.0
        return float(min(self.max_delay, self.first_delay * 2 ** (recent - 1)))
