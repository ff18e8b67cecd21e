"""A lab pod and the processes started in it (the lab is built by ``vnetd.lab.open_lab``).

Processes run in their pod's network namespace and, by default, in a private
mount namespace with their own tmpfs on ``/run/wireguard``, so every pod can
use the same WireGuard interface name.
"""

from __future__ import annotations

import os
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

import trio

from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR
from vnetd.lab.netns import signal_pid

WG_RUN_DIR = SOCKET_DIR
STOP_TIMEOUT = 5.0
KILL_WAIT = 5.0


class LabError(RuntimeError):
    """The lab could not be built or a lab process misbehaved."""


@dataclass(frozen=True)
class Pod:
    """One simulated pod: a network namespace on the lab bridge plus a directory."""

    index: int
    name: str
    netns: str
    underlay_ip: str
    dir: Path
    """``<workdir>/<name>``: holds ``state/`` and ``logs/``."""
    underlay_ip6: str | None = None
    """The pod's IPv6 underlay address (``open_lab(ipv6=True)``), else None."""

    @property
    def state_dir(self) -> Path:
        """Persistent across restarts of the pod's processes (keys, caches)."""
        return self.dir / "state"

    @property
    def log_dir(self) -> Path:
        """One log file per process started in this pod."""
        return self.dir / "logs"


@dataclass
class LabProcess:
    """A process started in a pod; ``pid`` is the program's own pid."""

    pod: Pod
    argv: list[str]
    log_path: Path
    _process: trio.Process = field(repr=False)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """None while running; negative signal number if killed by one."""
        return self._process.poll()

    async def wait(self, timeout: float) -> int:  # noqa: ASYNC109 (the lab's API)
        """Wait for the exit code.

        Raises:
            trio.TooSlowError: still running after ``timeout`` s.
        """
        with trio.fail_after(timeout):
            return await self._process.wait()

    async def stop(
        self,
        sig: int = signal.SIGTERM,
        timeout: float = STOP_TIMEOUT,  # noqa: ASYNC109 (the lab's API)
    ) -> int:
        """Send ``sig`` by pid, wait up to ``timeout`` s, then SIGKILL; returns the exit code.

        Raises:
            LabError: the process survived SIGKILL for ``KILL_WAIT`` s.

        Cancellation: shielded, bounded by ``timeout + KILL_WAIT``.
        """
        with trio.CancelScope(shield=True):
            if self.returncode is None:
                signal_pid(self.pid, sig)
                with trio.move_on_after(timeout):
                    await self._process.wait()
            if self.returncode is None:
                signal_pid(self.pid, signal.SIGKILL)
                with trio.move_on_after(KILL_WAIT):
                    await self._process.wait()
        code = self.returncode
        if code is None:
            raise LabError(f"pid {self.pid} ({self.argv[0]}) survived SIGKILL")
        return code

    def kill(self) -> None:
        """SIGKILL by pid (a no-op once it has exited and been reaped)."""
        if self.returncode is None:
            signal_pid(self.pid, signal.SIGKILL)

    def log_text(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def namespace_wrapper(
    pod: Pod, *, private_mount: bool, hostname: str | None, beside: LabProcess | None
) -> list[str]:
    """The argv prefix that runs a program in ``pod`` (or beside a running process).

    Raises:
        LabError: ``beside`` has exited.
    """
    if beside is not None:
        if beside.returncode is not None:
            raise LabError(f"pid {beside.pid} ({beside.argv[0]}) has exited")
        return ["nsenter", "-t", str(beside.pid), "-n", "-m", "-u", "--"]
    wrapper = ["ip", "netns", "exec", pod.netns]
    flags: list[str] = []
    steps: list[str] = []
    if private_mount:
        os.makedirs(WG_RUN_DIR, exist_ok=True)
        flags += ["-m", "--propagation", "private"]
        steps.append(f"mount -t tmpfs none {WG_RUN_DIR}")
    if hostname is not None:
        flags.append("-u")
        steps.append(f"hostname {shlex.quote(hostname)}")
    if flags:
        script = " && ".join([*steps, 'exec "$@"'])
        wrapper += ["unshare", *flags, "sh", "-c", script, "sh"]
    return wrapper
