"""The netns lab: pods on one machine, a bridge, and etcd, all in namespaces.

Layout of a lab with id ``ab12`` (nothing lives in the root namespace)::

    vlab-ab12-sw     bridge br0; veth p0..pN-1 and "etcd" enslaved to it
    vlab-ab12-pod0   eth0 198.18.1.0/15, lo up, no default route
    vlab-ab12-pod1   eth0 198.18.1.1/15 ...
    vlab-ab12-etcd   eth0 198.18.0.10/15, etcd on :2379

With ``open_lab(..., static_neighbours=True)`` every eth0 gets a fixed MAC
address and every namespace a permanent neighbour entry for every other one,
so nothing is resolved by ARP. The kernel's neighbour table is global: its
``gc_thresh3`` (1024 entries by default, settable only in the root namespace)
counts the entries of every namespace together, and a full mesh of 64 pods
needs about 4,000, so resolution fails with ENOBUFS ("neighbor table
overflow") for every lab on the machine. Permanent entries are exempt from
that limit. The big benchmark labs use it; a real cluster has no such limit
to share.

Processes started with ``Lab.start`` run in their pod's network namespace and
in a private mount namespace with their own tmpfs on ``/run/wireguard``, so
every pod can use the same WireGuard interface name. A marker file
``/run/vnetd-lab/<id>.json`` names the owning process; ``cleanup_stale_labs``
removes labs whose owner is dead, never a live one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from vnetd.dataplane.uapi_protocol import SOCKET_DIR
from vnetd.lab.etcd import EtcdServer, EtcdTls, etcdctl_failure, run_etcd, run_etcdctl
from vnetd.lab.etcd_cluster import ClusterError, EtcdCluster
from vnetd.lab.netns import (
    add_netns,
    delete_netns,
    ip_batch,
    kill_pids,
    list_netns,
    pid_alive,
    pids_in_netns,
    proc_start_time,
    signal_pid,
)

LAB_RUN_DIR = Path("/run/vnetd-lab")
WG_RUN_DIR = SOCKET_DIR
NETNS_PREFIX = "vlab-"
_NETNS_RE = re.compile(r"^vlab-([0-9a-f]{4})-")
_WORKDIR_PREFIX = "vnetd-lab-"

UNDERLAY_PREFIXLEN = 15
FIRST_POD_IP = ipaddress.IPv4Address("198.18.1.0")
ETCD_IP = "198.18.0.10"
UNDERLAY6_PREFIX = "fd00:198:18::"
"""With ``open_lab(ipv6=True)`` pod i also has ``fd00:198:18::<i+1>/64`` on eth0."""
ETCD_PORT = 2379
ETCD_MAC = "02:76:6c:ff:00:01"
MAX_PODS = 1000
"""A Linux bridge takes at most 1024 ports."""

STOP_TIMEOUT = 5.0
KILL_WAIT = 5.0
TEARDOWN_TIMEOUT = 40.0


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


class Lab:
    """A built lab; get one from ``open_lab``."""

    def __init__(
        self,
        lab_id: str,
        workdir: Path,
        pods: int,
        *,
        mtu: int | None = None,
        ipv6: bool = False,
        static_neighbours: bool = False,
        etcd_members: int = 1,
    ) -> None:
        self.id = lab_id
        self.mtu = mtu
        """The underlay MTU of every veth and the bridge (None: the kernel's 1500)."""
        self.ipv6 = ipv6
        self.static_neighbours = static_neighbours
        """Fixed MACs and permanent neighbour entries instead of ARP (see the module doc)."""
        self.workdir = workdir
        self.switch_netns = f"{NETNS_PREFIX}{lab_id}-sw"
        self.etcd_netns = f"{NETNS_PREFIX}{lab_id}-etcd"
        self.etcd_url = f"http://{ETCD_IP}:{ETCD_PORT}"
        self.etcdctl_flags: list[str] = []
        """Extra etcdctl flags: TLS files (set by ``start_etcd``), ``--user`` once auth is on."""
        self.pods = [self._pod(i) for i in range(pods)]
        self.processes: list[LabProcess] = []
        self.etcd_cluster: EtcdCluster | None = None
        """With ``etcd_members`` > 1: the cluster (module ``etcd_cluster``); the etcd
        namespace then only runs ``etcdctl``, as the cluster's admin host."""
        if etcd_members > 1:
            self.etcd_cluster = EtcdCluster(lab_id, workdir, etcd_members, self.etcd_netns)
            self.etcd_url = self.etcd_cluster.urls[0]
        self._etcd: EtcdServer | None = None
        self._etcd_stack = AsyncExitStack()
        self._seq = 0
        self._closed = False

    def _pod(self, index: int) -> Pod:
        name = f"pod{index}"
        return Pod(
            index=index,
            name=name,
            netns=f"{NETNS_PREFIX}{self.id}-{name}",
            underlay_ip=str(FIRST_POD_IP + index),
            dir=self.workdir / name,
            underlay_ip6=f"{UNDERLAY6_PREFIX}{index + 1:x}" if self.ipv6 else None,
        )

    @property
    def netns_names(self) -> list[str]:
        """Every namespace this lab makes: pods, etcd (and its members), switch."""
        members = [m.netns for m in self.etcd_cluster.members] if self.etcd_cluster else []
        return [*(p.netns for p in self.pods), self.etcd_netns, *members, self.switch_netns]

    @property
    def etcd_urls(self) -> list[str]:
        """Every etcd client URL: the cluster's members, else the one etcd."""
        return self.etcd_cluster.urls if self.etcd_cluster else [self.etcd_url]

    @property
    def etcd(self) -> EtcdServer | None:
        """The etcd server once started (its ``pid`` is 0 while stopped)."""
        return self._etcd

    async def start_etcd(self, *, fresh: bool = False, tls: EtcdTls | None = None) -> EtcdServer:
        """Start etcd in the etcd namespace (again, on the same data, after ``stop_etcd``).

        Args:
            fresh: after ``stop_etcd``, start on an empty data dir instead, as
                an etcd that lost its volume would come back.
            tls: the first start only: serve clients over https
                (``open_lab(..., with_etcd=False)``, then this); ``etcd_url`` and
                ``etcdctl`` follow.

        Raises:
            EtcdStartError: it did not answer within 20 s.
            LabError: ``fresh`` while etcd runs.
        """
        self._check_open()
        if self.etcd_cluster is not None:
            if tls is not None or fresh:
                raise LabError("an etcd cluster starts plain and once; use its own faults")
            self._etcd_stack.push_async_callback(self.etcd_cluster.close)
            await self.etcd_cluster.start()
            return self.etcd_cluster.members[0].server
        if self._etcd is None:
            self._etcd = await self._etcd_stack.enter_async_context(
                run_etcd(
                    self.workdir / "etcd" / "data",
                    ETCD_IP,
                    ETCD_PORT,
                    netns=self.etcd_netns,
                    name=f"vlab-{self.id}",
                    tls=tls,
                )
            )
            self.etcd_url = self._etcd.url
            if tls is not None:
                self.etcdctl_flags = [*tls.etcdctl_flags(), *self.etcdctl_flags]
        elif self._etcd.pid == 0:
            await self._etcd.start(fresh=fresh)
        elif fresh:
            raise LabError("etcd is running: stop_etcd() before starting it fresh")
        return self._etcd

    async def stop_etcd(self) -> None:
        """Stop etcd by pid (SIGTERM, SIGKILL after 5 s); its data stays for a restart."""
        if self._etcd is not None:
            await self._etcd.stop()

    async def etcdctl(
        self,
        *args: str,
        timeout: float = 10.0,  # noqa: ASYNC109 (the lab's API)
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``etcdctl ARGS`` in the etcd namespace against the lab's etcd.

        Raises:
            LabError: it exited non-zero (the message holds its stderr).
            trio.TooSlowError: it ran over ``timeout`` s (it is killed).
        """
        self._check_open()
        if self.etcd_cluster is not None:
            try:
                return await self.etcd_cluster.etcdctl(*args, timeout=timeout)
            except ClusterError as exc:
                raise LabError(str(exc)) from None
        result = await run_etcdctl(
            self.etcd_netns, [self.etcd_url], args, flags=self.etcdctl_flags, timeout=timeout
        )
        failure = etcdctl_failure(args, result)
        if failure is not None:
            raise LabError(failure)
        return result

    async def set_sysctl(self, netns: str, key: str, value: str) -> None:
        """Set a per-namespace sysctl (``net.*``) in one of this lab's namespaces.

        Sockets take e.g. ``net.ipv4.tcp_rmem`` when they are made: set it
        before starting the processes it should apply to.

        Raises:
            ValueError: ``netns`` is not one of this lab's.
            LabError: ``sysctl`` refused.
        """
        self._check_open()
        if netns not in self.netns_names:
            raise ValueError(f"{netns} is not a namespace of lab {self.id}")
        argv = ["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"]
        with trio.fail_after(10):
            result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True,
                                            check=False)  # fmt: skip
        if result.returncode != 0:
            raise LabError(f"sysctl {key} in {netns}: {result.stderr.decode(errors='replace')}")

    async def etcd_revision(self) -> int:
        """The etcd store's current revision."""
        result = await self.etcdctl("endpoint", "status", "--write-out", "json")
        status = json.loads(result.stdout)
        return int(status[0]["Status"]["header"]["revision"])

    async def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history up to ``revision`` (default: the current one).

        A watch from an older revision is then refused as compacted. Returns
        the revision compacted to.
        """
        target = revision if revision is not None else await self.etcd_revision()
        await self.etcdctl("compaction", str(target))
        return target

    async def start(
        self,
        pod: Pod,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        private_mount: bool = True,
        hostname: str | None = None,
        beside: LabProcess | None = None,
    ) -> LabProcess:
        """Start ``argv`` inside ``pod``; stdout and stderr go to a log in ``pod.log_dir``.

        Args:
            pod: one of ``self.pods``.
            argv: the program and its arguments.
            env: variables added to (or overriding) this process's environment.
            private_mount: also give it a private mount namespace with its own
                tmpfs on /run/wireguard.
            hostname: also give it a private UTS namespace with this hostname.
            beside: instead of new namespaces, join this running process's
                network, mount and UTS namespaces (as a second container of
                the same pod would see its sidecar's interface and sockets).
        """
        self._check_open()
        if not argv:
            raise ValueError("argv is empty")
        self._seq += 1
        log_path = pod.log_dir / f"{self._seq:03d}-{Path(argv[0]).name}.log"
        wrapper = self._wrapper(pod, private_mount=private_mount, hostname=hostname, beside=beside)
        full_env = {**os.environ, **env} if env is not None else None
        with log_path.open("ab") as log:
            process = await trio.lowlevel.open_process(
                [*wrapper, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
            )
        lab_process = LabProcess(pod, list(argv), log_path, process)
        self.processes.append(lab_process)
        return lab_process

    def _wrapper(
        self, pod: Pod, *, private_mount: bool, hostname: str | None, beside: LabProcess | None
    ) -> list[str]:
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

    async def run(
        self,
        pod: Pod,
        argv: Sequence[str],
        timeout: float = 10.0,  # noqa: ASYNC109 (the lab's API)
        *,
        beside: LabProcess | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a short command in ``pod``'s network namespace and capture its output.

        Args:
            beside: run in this process's network, mount and UTS namespaces instead.

        Raises:
            trio.TooSlowError: it ran over ``timeout`` s (it is killed).
        """
        self._check_open()
        wrapper = self._wrapper(pod, private_mount=False, hostname=None, beside=beside)
        with trio.fail_after(timeout):
            return await trio.run_process(
                [*wrapper, *argv],
                stdin=b"",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    async def kill_pod(self, pod: Pod) -> None:
        """SIGKILL every process in ``pod``'s network namespace, as a node failure would.

        Raises:
            LabError: a process survived SIGKILL for ``KILL_WAIT`` s.
        """
        pids = pids_in_netns([pod.netns]).get(pod.netns, [])
        for pid in pids:
            signal_pid(pid, signal.SIGKILL)
        for process in self.processes:
            if process.pod.index == pod.index and process.returncode is None:
                with trio.move_on_after(KILL_WAIT):
                    await process._process.wait()
        # Grandchildren (wireguard-go) are reaped by init; poll /proc for them.
        left = await kill_pids([pid for pid in pids if pid_alive(pid)], grace=KILL_WAIT)
        if left:
            raise LabError(f"pids {left} in {pod.netns} survived SIGKILL")

    async def move_pod(self, pod: Pod, underlay_ip: str) -> Pod:
        """Give ``pod`` a new underlay address, as a pod rescheduled elsewhere gets.

        The old address is removed from eth0 and ``underlay_ip`` (inside
        198.18.0.0/15) added; returns the updated pod, which also replaces
        the old one in ``self.pods``.
        """
        self._check_open()
        network = ipaddress.ip_network(f"{FIRST_POD_IP}/{UNDERLAY_PREFIXLEN}", strict=False)
        if ipaddress.ip_address(underlay_ip) not in network:
            raise ValueError(f"{underlay_ip} is not in the lab's underlay {network}")
        await ip_batch(
            [f"addr del {pod.underlay_ip}/{UNDERLAY_PREFIXLEN} dev eth0",
             f"addr add {underlay_ip}/{UNDERLAY_PREFIXLEN} dev eth0"], netns=pod.netns,
        )  # fmt: skip
        moved = replace(pod, underlay_ip=underlay_ip)
        self.pods[pod.index] = moved
        if self.static_neighbours:
            for netns, _ in self._hosts():
                if netns != pod.netns:
                    await ip_batch(
                        [f"neigh del {pod.underlay_ip} dev eth0",
                         f"neigh replace {underlay_ip} lladdr {_mac(pod.index)} dev eth0 "
                         "nud permanent"], netns=netns, force=True,
                    )  # fmt: skip
        return moved

    def _hosts(self) -> list[tuple[str, str]]:
        """(namespace, IPv4 underlay address) of every pod and of etcd (and its members)."""
        hosts = [(p.netns, p.underlay_ip) for p in self.pods] + [(self.etcd_netns, ETCD_IP)]
        if self.etcd_cluster:
            hosts += [(m.netns, m.ip) for m in self.etcd_cluster.members]
        return hosts

    async def _pin_neighbours(self) -> None:
        """Permanent neighbour entries in every namespace for every other one (IPv4 and IPv6)."""
        entries = [(p.netns, p.underlay_ip, _mac(p.index)) for p in self.pods]
        entries += [(p.netns, p.underlay_ip6, _mac(p.index)) for p in self.pods if p.underlay_ip6]
        entries.append((self.etcd_netns, ETCD_IP, ETCD_MAC))
        if self.etcd_cluster:
            entries += [(m.netns, m.ip, m.mac) for m in self.etcd_cluster.members]
        for netns, _ in self._hosts():
            await ip_batch(
                [f"neigh replace {addr} lladdr {mac} dev eth0 nud permanent"
                 for owner, addr, mac in entries if owner != netns]
            , netns=netns)  # fmt: skip

    def _check_open(self) -> None:
        if self._closed:
            raise LabError(f"lab {self.id} is closed")

    async def _make_dirs_and_netns(self) -> None:
        """Every pod's directories, etcd's, and every namespace of ``netns_names``."""
        for pod in self.pods:
            pod.state_dir.mkdir(parents=True, exist_ok=True)
            pod.log_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "etcd").mkdir(parents=True, exist_ok=True)
        await add_netns(self.netns_names)

    async def _build(self) -> None:
        await self._make_dirs_and_netns()
        ports = [(f"p{p.index}", p.netns, _mac(p.index)) for p in self.pods]
        ports.append(("etcd", self.etcd_netns, ETCD_MAC))
        if self.etcd_cluster:
            ports += [(f"etcd{m.index}", m.netns, m.mac) for m in self.etcd_cluster.members]
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        mtu = f" mtu {self.mtu}" if self.mtu else ""
        if mtu:
            switch.append(f"link set br0{mtu}")
        for port, netns, mac in ports:
            switch += [f"link add {port}{mtu} type veth peer name eth0{mtu} address {mac} "
                       f"netns {netns}",
                       f"link set {port} master br0 up"]  # fmt: skip
        await ip_batch(switch, netns=self.switch_netns)
        for pod in self.pods:
            if pod.underlay_ip6:
                await ip_batch([f"addr add {pod.underlay_ip6}/64 dev eth0 nodad"], netns=pod.netns)
        for netns, addr in self._hosts():
            await ip_batch(
                ["link set lo up", f"addr add {addr}/{UNDERLAY_PREFIXLEN} dev eth0",
                 "link set eth0 up"], netns=netns,
            )  # fmt: skip
        if self.static_neighbours:
            await self._pin_neighbours()

    async def _teardown(self, *, remove_workdir: bool) -> None:
        """Stop everything by pid and delete every namespace and the marker."""
        self._closed = True
        with trio.move_on_after(TEARDOWN_TIMEOUT, shield=True):
            running = [p for p in self.processes if p.returncode is None]
            for p in running:
                signal_pid(p.pid, signal.SIGTERM)
            for p in running:
                with contextlib.suppress(LabError):
                    await p.stop(timeout=STOP_TIMEOUT)
            try:
                await self._etcd_stack.aclose()
                await _destroy_netns(self.netns_names)
            finally:
                _remove_marker(self.id)
                if remove_workdir:
                    shutil.rmtree(self.workdir, ignore_errors=True)


def _mac(index: int) -> str:
    """Pod ``index``'s fixed, locally administered eth0 MAC address."""
    return f"02:76:6c:00:{(index + 1) >> 8:02x}:{(index + 1) & 0xFF:02x}"


async def _destroy_netns(names: Sequence[str]) -> None:
    """Kill (by pid) whatever still runs in the namespaces, then delete them."""
    leftover = [pid for pids in pids_in_netns(names).values() for pid in pids]
    if leftover:
        await kill_pids(leftover)
    await delete_netns(names)


@asynccontextmanager
async def open_lab(
    pods: int,
    *,
    workdir: Path | None = None,
    with_etcd: bool = True,
    mtu: int | None = None,
    ipv6: bool = False,
    static_neighbours: bool = False,
    etcd_members: int = 1,
    make: Callable[[str, Path], Lab] | None = None,
) -> AsyncIterator[Lab]:
    """Build a lab of ``pods`` pods (and etcd), yield it, and tear it all down.

    Args:
        pods: how many pods (1..1000); pod i has underlay address 198.18.1.0 + i.
        workdir: where pod dirs, logs and etcd data go; kept afterwards. None
            makes a temp dir that is removed on exit.
        with_etcd: start etcd now; otherwise call ``Lab.start_etcd`` later.
        mtu: the underlay MTU of the veths and the bridge (None: 1500).
        ipv6: give each pod an IPv6 underlay address too (``Pod.underlay_ip6``,
            ``fd00:198:18::<i+1>/64``); etcd stays on IPv4.
        static_neighbours: pin every underlay neighbour instead of resolving
            it by ARP; needed beyond ~30 pods (see the module doc).
        etcd_members: 3 (or more) runs an etcd cluster, each member in its own
            namespace (``Lab.etcd_cluster``, module ``etcd_cluster``).
        make: builds another layout from ``(lab id, workdir)`` instead of ``Lab``
            (``lab.sites``); the other layout options are then its own.

    Raises:
        LabError: a namespace or link could not be made (all is undone).
        EtcdStartError: etcd did not start.

    Cancellation: teardown runs shielded, bounded by ``TEARDOWN_TIMEOUT``:
    processes get SIGTERM then SIGKILL by pid, namespaces are deleted, and the
    temp workdir is removed, also on an exception or cancellation.
    """
    if not 1 <= pods <= MAX_PODS:
        raise ValueError(f"pods must be 1..{MAX_PODS}, got {pods}")
    await cleanup_stale_labs()
    created = workdir is None
    lab_id = _claim_lab_id()
    try:
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{lab_id}-"))
        else:
            workdir.mkdir(parents=True, exist_ok=True)
        _write_marker(lab_id, workdir if created else None)
    except BaseException:
        _remove_marker(lab_id)
        raise
    lab = make(lab_id, workdir) if make else Lab(
        lab_id, workdir, pods, mtu=mtu, ipv6=ipv6, static_neighbours=static_neighbours,
        etcd_members=etcd_members,
    )  # fmt: skip
    try:
        try:
            await lab._build()
        except Exception as exc:
            raise LabError(f"building lab {lab_id} failed: {exc}") from exc
        if with_etcd:
            await lab.start_etcd()
        yield lab
    finally:
        await lab._teardown(remove_workdir=created)


async def cleanup_stale_labs() -> list[str]:
    """Remove the namespaces, processes and temp dirs of labs whose owner is dead.

    A lab is live while the pid in its marker runs with the same start time;
    namespaces named like a lab but without a marker are orphans. Returns the
    ids of the labs removed.
    """
    markers = _read_markers()
    live = {lab_id for lab_id, m in markers.items() if _owner_alive(m)}
    stale_ns: dict[str, list[str]] = {}
    for name in await list_netns():
        match = _NETNS_RE.match(name)
        if match and match.group(1) not in live:
            stale_ns.setdefault(match.group(1), []).append(name)
    stale_ids = sorted(set(stale_ns) | (set(markers) - live))
    if not stale_ids:
        return []
    with trio.move_on_after(TEARDOWN_TIMEOUT, shield=True):
        await _destroy_netns([n for names in stale_ns.values() for n in names])
        for lab_id in stale_ids:
            workdir = markers.get(lab_id, {}).get("workdir")
            if isinstance(workdir, str) and Path(workdir).name.startswith(_WORKDIR_PREFIX):
                shutil.rmtree(workdir, ignore_errors=True)
            _remove_marker(lab_id)
    return stale_ids


def _claim_lab_id() -> str:
    """A fresh 4-hex id whose marker names this process; the marker appears whole."""
    LAB_RUN_DIR.mkdir(parents=True, exist_ok=True)
    tmp = LAB_RUN_DIR / f"claim.tmp{os.getpid()}"
    tmp.write_text(json.dumps(_owner_record(None)))
    try:
        for _ in range(100):
            lab_id = secrets.token_hex(2)
            try:
                os.link(tmp, LAB_RUN_DIR / f"{lab_id}.json")
            except FileExistsError:
                continue
            return lab_id
    finally:
        tmp.unlink()
    raise LabError(f"no free lab id in {LAB_RUN_DIR} (clean it up)")


def _owner_record(workdir: Path | None) -> dict[str, Any]:
    pid = os.getpid()
    return {"pid": pid, "start": proc_start_time(pid),
            "workdir": str(workdir) if workdir else None}  # fmt: skip


def _write_marker(lab_id: str, workdir: Path | None) -> None:
    path = LAB_RUN_DIR / f"{lab_id}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(_owner_record(workdir)))
    os.replace(tmp, path)


def _read_markers() -> dict[str, dict[str, Any]]:
    LAB_RUN_DIR.mkdir(parents=True, exist_ok=True)
    return {path.stem: _read_marker(path) for path in LAB_RUN_DIR.glob("*.json")}


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _owner_alive(marker: Mapping[str, Any]) -> bool:
    pid, start = marker.get("pid"), marker.get("start")
    return isinstance(pid, int) and start is not None and proc_start_time(pid) == start


def _remove_marker(lab_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (LAB_RUN_DIR / f"{lab_id}.json").unlink()
