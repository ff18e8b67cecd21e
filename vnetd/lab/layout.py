"""The built lab: its namespaces on one bridge, its etcd, and the processes started in pods.

``open_lab`` (module ``vnetd.lab.open_lab``) builds and tears it down; the layout
is drawn there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import trio

from vnetd.lab.etcd import EtcdServer, EtcdTls, etcdctl_failure, run_etcd, run_etcdctl
from vnetd.lab.etcd_cluster import ClusterError, EtcdCluster
from vnetd.lab.markers import NETNS_PREFIX, TEARDOWN_TIMEOUT, destroy_netns, remove_marker
from vnetd.lab.netns import add_netns, ip_batch, kill_pids, pid_alive, pids_in_netns, signal_pid
from vnetd.lab.pods import KILL_WAIT, STOP_TIMEOUT, LabError, LabProcess, Pod, namespace_wrapper
from vnetd.lab.underlay import (
    ETCD_IP,
    ETCD_MAC,
    ETCD_PORT,
    FIRST_POD_IP,
    UNDERLAY6_PREFIX,
    UNDERLAY_PREFIXLEN,
    host_commands,
    pin_neighbours,
    pod_mac,
    repin_neighbour,
    switch_commands,
    underlay_network,
)


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
        """Fixed MACs and permanent neighbour entries instead of ARP (module ``underlay``)."""
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

    async def start_etcd(
        self,
        *,
        fresh: bool = False,
        tls: EtcdTls | None = None,
        extra_flags: Sequence[str] = (),
    ) -> EtcdServer:
        """Start etcd in the etcd namespace (again, on the same data, after ``stop_etcd``).

        Args:
            fresh: after ``stop_etcd``, start on an empty data dir instead, as
                an etcd that lost its volume would come back.
            tls: the first start only: serve clients over https
                (``open_lab(..., with_etcd=False)``, then this); ``etcd_url`` and
                ``etcdctl`` follow.
            extra_flags: the first start only: more of etcd's flags
                (``--quota-backend-bytes``, say), kept across restarts.

        Raises:
            EtcdStartError: it did not answer within 20 s.
            LabError: ``fresh`` while etcd runs.
        """
        self._check_open()
        if self.etcd_cluster is not None:
            if tls is not None or fresh or extra_flags:
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
                    extra_flags=extra_flags,
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
        wrapper = namespace_wrapper(
            pod, private_mount=private_mount, hostname=hostname, beside=beside
        )
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
        wrapper = namespace_wrapper(pod, private_mount=False, hostname=None, beside=beside)
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
        network = underlay_network()
        if ipaddress.ip_address(underlay_ip) not in network:
            raise ValueError(f"{underlay_ip} is not in the lab's underlay {network}")
        await ip_batch(
            [f"addr del {pod.underlay_ip}/{UNDERLAY_PREFIXLEN} dev eth0",
             f"addr add {underlay_ip}/{UNDERLAY_PREFIXLEN} dev eth0"], netns=pod.netns,
        )  # fmt: skip
        moved = replace(pod, underlay_ip=underlay_ip)
        self.pods[pod.index] = moved
        if self.static_neighbours:
            others = [netns for netns, _ in self._hosts() if netns != pod.netns]
            await repin_neighbour(others, pod.underlay_ip, underlay_ip, pod_mac(pod.index))
        return moved

    def _hosts(self) -> list[tuple[str, str]]:
        """(namespace, IPv4 underlay address) of every pod and of etcd (and its members)."""
        hosts = [(p.netns, p.underlay_ip) for p in self.pods] + [(self.etcd_netns, ETCD_IP)]
        if self.etcd_cluster:
            hosts += [(m.netns, m.ip) for m in self.etcd_cluster.members]
        return hosts

    async def _pin_neighbours(self) -> None:
        """Permanent neighbour entries in every namespace for every other one (IPv4 and IPv6)."""
        entries = [(p.netns, p.underlay_ip, pod_mac(p.index)) for p in self.pods]
        entries += [
            (p.netns, p.underlay_ip6, pod_mac(p.index)) for p in self.pods if p.underlay_ip6
        ]
        entries.append((self.etcd_netns, ETCD_IP, ETCD_MAC))
        if self.etcd_cluster:
            entries += [(m.netns, m.ip, m.mac) for m in self.etcd_cluster.members]
        await pin_neighbours([netns for netns, _ in self._hosts()], entries)

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
        ports = [(f"p{p.index}", p.netns, pod_mac(p.index)) for p in self.pods]
        ports.append(("etcd", self.etcd_netns, ETCD_MAC))
        if self.etcd_cluster:
            ports += [(f"etcd{m.index}", m.netns, m.mac) for m in self.etcd_cluster.members]
        await ip_batch(switch_commands(ports, self.mtu), netns=self.switch_netns)
        for pod in self.pods:
            if pod.underlay_ip6:
                await ip_batch([f"addr add {pod.underlay_ip6}/64 dev eth0 nodad"], netns=pod.netns)
        for netns, addr in self._hosts():
            await ip_batch(host_commands(addr), netns=netns)
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
                await destroy_netns(self.netns_names)
            finally:
                remove_marker(self.id)
                if remove_workdir:
                    shutil.rmtree(self.workdir, ignore_errors=True)
