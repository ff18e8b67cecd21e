"""A three-member etcd cluster in the lab, and the faults a cluster has.

``open_lab(..., etcd_members=3)`` gives each member its own namespace on the
lab bridge (``vlab-<id>-etcd0`` .. ``etcd2``, 198.18.0.11 .. 13, peer traffic
on :2380 between them) and starts them as one cluster. The lab's own etcd
namespace (198.18.0.10) then runs no etcd: it is the admin host from which
``etcdctl`` reaches the members, so no fault ever cuts the tests off.

Faults, each on one member: ``kill`` (SIGKILL), ``stop`` (SIGTERM) and
``restart`` (same data dir), ``freeze``/``thaw`` (SIGSTOP/SIGCONT: it still
accepts TCP connections and never answers), ``partition``/``heal`` (nft in
its namespace drops peer-port traffic to and from the other members, while
clients still reach it), ``replace`` (``member remove``, then a fresh member
with an empty data dir through ``member add`` and
``--initial-cluster-state existing``). Every process is stopped by pid on
``close``, thawed first, also on failure.
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import trio

from vnetd.lab.etcd import (
    NETNS_CLIENT_PORT,
    NETNS_PEER_PORT,
    EtcdServer,
    etcdctl_failure,
    run_etcdctl,
)

FIRST_MEMBER_IP = ipaddress.IPv4Address("198.18.0.11")
NFT_BIN = "nft"
NFT_TABLE = "vlab_partition"
ETCDCTL_TIMEOUT = 10.0
HEALTHY_TIMEOUT = 30.0
RECONFIGURE_TIMEOUT = 30.0


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says which and why."""


@dataclass
class ClusterMember:
    """One member: its namespace, address and (re)started process."""

    index: int
    netns: str
    ip: str
    mac: str
    server: EtcdServer
    generation: int = 0
    """How many times it was replaced by a fresh member."""
    frozen: bool = False
    partitioned: bool = False

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def peer_url(self) -> str:
        return self.server.peer_url

    @property
    def running(self) -> bool:
        return self.server.pid != 0

    @property
    def serving(self) -> bool:
        """Running, not frozen and not partitioned: the admin host may use it."""
        return self.running and not self.frozen and not self.partitioned


def member_names(lab_id: str, count: int) -> list[tuple[str, str, str]]:
    """(namespace, IPv4 address, MAC) of each member of lab ``lab_id``."""
    return [
        (f"vlab-{lab_id}-etcd{i}", str(FIRST_MEMBER_IP + i), f"02:76:6c:ff:00:{i + 2:02x}")
        for i in range(count)
    ]


class EtcdCluster:
    """The lab's etcd cluster; made by the lab, started by ``Lab.start_etcd``."""

    def __init__(self, lab_id: str, workdir: Path, count: int, admin_netns: str) -> None:
        self.admin_netns = admin_netns
        self.members: list[ClusterMember] = []
        for i, (netns, ip, mac) in enumerate(member_names(lab_id, count)):
            data_dir = workdir / "etcd" / f"member{i}" / "data"
            server = EtcdServer(
                url=f"http://{ip}:{NETNS_CLIENT_PORT}",
                pid=0,
                data_dir=data_dir,
                log_path=data_dir.with_name("etcd.log"),
                netns=netns,
                name=f"m{i}",
                peer_url=f"http://{ip}:{NETNS_PEER_PORT}",
            )
            self.members.append(ClusterMember(i, netns, ip, mac, server))
        initial = ",".join(f"{m.server.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.server.initial_cluster = initial

    @property
    def urls(self) -> list[str]:
        """Every member's client URL, in member order (what the daemons are given)."""
        return [m.url for m in self.members]

    def serving_urls(self) -> list[str]:
        return [m.url for m in self.members if m.serving]

    async def start(self) -> None:
        """Start every member at once (each waits for a quorum) and wait for a leader."""
        for member in self.members:
            member.server.data_dir.parent.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery:
            for member in self.members:
                nursery.start_soon(member.server.start)
        await self.wait_healthy()

    async def close(self) -> None:
        """Stop every member by pid (thawed first). Cancellation: shielded."""
        with trio.CancelScope(shield=True):
            for member in self.members:
                if member.running:
                    member.server.send_signal(signal.SIGCONT)
            for member in self.members:
                await member.server.stop()

    async def etcdctl(
        self,
        *args: str,
        endpoints: list[str] | None = None,
        timeout: float = ETCDCTL_TIMEOUT,  # noqa: ASYNC109 (the lab's API)
    ) -> subprocess.CompletedProcess[bytes]:
        """``etcdctl ARGS`` from the admin namespace against ``endpoints`` (default:
        every serving member).

        Raises:
            ClusterError: it exited non-zero, or no member serves.
            trio.TooSlowError: it ran over ``timeout`` s (it is killed).
        """
        urls = endpoints if endpoints is not None else self.serving_urls()
        if not urls:
            raise ClusterError("no etcd member is serving")
        result = await run_etcdctl(self.admin_netns, urls, args, timeout=timeout)
        failure = etcdctl_failure(args, result)
        if failure is not None:
            raise ClusterError(failure)
        return result

    async def statuses(self) -> dict[int, dict[str, object]]:
        """``endpoint status`` of each serving member that answers: index -> its Status."""
        index_of = {m.url: m.index for m in self.members}
        found: dict[int, dict[str, object]] = {}
        for url in self.serving_urls():
            try:
                result = await self.etcdctl("endpoint", "status", "-w", "json", endpoints=[url])
            except (ClusterError, trio.TooSlowError):
                continue
            for entry in json.loads(result.stdout):
                found[index_of[entry["Endpoint"]]] = entry["Status"]
        return found

    async def leader(self) -> int:
        """The index of the member that leads now.

        Raises:
            ClusterError: no serving member knows a leader among the members.
        """
        ids = await self._member_ids()
        for status in (await self.statuses()).values():
            leader = status.get("leader")
            if isinstance(leader, int) and leader in ids:
                return ids[leader]
        raise ClusterError("no member knows a leader")

    async def move_leader(self, index: int) -> None:
        """Make member ``index`` the leader (etcd's MoveLeader; nothing if it leads
        already) and wait until every serving member agrees.

        Raises:
            ClusterError: etcd refused, or another member leads afterwards.
            trio.TooSlowError: the members did not agree within the health bound.
        """
        if await self.leader() == index:
            return
        member_id = {at: member for member, at in (await self._member_ids()).items()}[index]
        await self.etcdctl("move-leader", f"{member_id:x}")
        await self.wait_healthy()
        leader = await self.leader()
        if leader != index:
            raise ClusterError(f"member {leader} leads after moving the leadership to {index}")

    async def version(self) -> str:
        """The etcd version a serving member reports (``endpoint status``), or ""."""
        for status in (await self.statuses()).values():
            version = status.get("version")
            if isinstance(version, str):
                return version
        return ""

    async def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT) -> None:  # noqa: ASYNC109
        """Wait until every serving member answers and all agree on one serving leader.

        Raises:
            trio.TooSlowError: not within ``timeout`` s.
        """
        with trio.fail_after(timeout):
            while True:
                statuses = await self.statuses()
                leaders = {s.get("leader") for s in statuses.values()}
                serving = {m.index for m in self.members if m.serving}
                leader = leaders.pop() if len(leaders) == 1 else None
                if set(statuses) == serving and isinstance(leader, int):
                    if (await self._member_ids()).get(leader, -1) in serving:
                        return
                await trio.sleep(0.2)

    async def kill(self, index: int) -> None:
        """SIGKILL member ``index`` by pid, as a crashed host; its data stays."""
        member = self.members[index]
        await member.server.stop(signal.SIGKILL)
        member.frozen = False

    async def stop(self, index: int) -> None:
        """SIGTERM member ``index`` (a graceful stop: a leader hands over first)."""
        member = self.members[index]
        await member.server.stop()
        member.frozen = False

    async def restart(self, index: int) -> None:
        """Start a stopped or killed member again on its data dir; waits until it answers."""
        await self.members[index].server.start()

    def freeze(self, index: int) -> None:
        """SIGSTOP member ``index``: connections are accepted, nothing is answered."""
        member = self.members[index]
        member.server.send_signal(signal.SIGSTOP)
        member.frozen = True

    def thaw(self, index: int) -> None:
        """SIGCONT a frozen member."""
        member = self.members[index]
        member.server.send_signal(signal.SIGCONT)
        member.frozen = False

    async def partition(self, index: int) -> None:
        """Cut member ``index`` from the others: nft in its namespace drops peer-port
        traffic to and from their addresses; clients still reach it."""
        member = self.members[index]
        others = ", ".join(m.ip for m in self.members if m.index != index)
        port = NETNS_PEER_PORT
        rules = f"""table inet {NFT_TABLE} {{
  set peers {{ type ipv4_addr; elements = {{ {others} }} }}
  chain input {{ type filter hook input priority 0; policy accept;
    ip saddr @peers tcp dport {port} drop; ip saddr @peers tcp sport {port} drop; }}
  chain output {{ type filter hook output priority 0; policy accept;
    ip daddr @peers tcp dport {port} drop; ip daddr @peers tcp sport {port} drop; }}
}}
"""
        await _nft(member.netns, ["-f", "-"], rules)
        member.partitioned = True

    async def heal(self, index: int) -> None:
        """Undo ``partition``."""
        member = self.members[index]
        await _nft(member.netns, ["delete", "table", "inet", NFT_TABLE])
        member.partitioned = False

    async def replace(self, index: int) -> None:
        """Remove member ``index`` and add a fresh one in its place (``remove``, then
        ``add_fresh``)."""
        await self.remove(index)
        await self.add_fresh(index)

    async def remove(self, index: int) -> None:
        """``member remove`` member ``index``, stop its process, and wait until the
        others agree on a leader."""
        member = self.members[index]
        others = [m.url for m in self.members if m.index != index and m.serving]
        ids = {i: member_id for member_id, i in (await self._member_ids()).items()}
        if index in ids:
            await self._reconfigure("member", "remove", f"{ids[index]:x}", endpoints=others)
        await member.server.stop(signal.SIGKILL)
        member.frozen = False
        await self.wait_healthy()

    async def add_fresh(self, index: int) -> None:
        """``member add`` a new member at removed member ``index``'s address, and start
        it on an empty data dir with ``--initial-cluster-state existing``; waits until
        it answers."""
        member = self.members[index]
        others = [m.url for m in self.members if m.index != index and m.serving]
        member.generation += 1
        name = f"m{index}g{member.generation}"
        result = await self._reconfigure(
            "member", "add", name, f"--peer-urls={member.peer_url}", endpoints=others
        )
        match = re.search(r'ETCD_INITIAL_CLUSTER="([^"]+)"', result.stdout.decode())
        if match is None:
            raise ClusterError(f"member add printed no initial cluster: {result.stdout!r}")
        member.server.name = name
        member.server.initial_cluster = match.group(1)
        member.server.cluster_state = "existing"
        await member.server.start(fresh=True)

    async def _reconfigure(
        self, *args: str, endpoints: list[str]
    ) -> subprocess.CompletedProcess[bytes]:
        """A membership change, retried while etcd refuses it as unsafe: its strict
        reconfiguration check wants the leader connected to the others for 5 s
        (``etcdserver: unhealthy cluster``), e.g. right after a heal or a restart."""
        with trio.fail_after(RECONFIGURE_TIMEOUT):
            while True:
                try:
                    return await self.etcdctl(*args, endpoints=endpoints)
                except ClusterError as exc:
                    if "unhealthy cluster" not in str(exc) and "timed out" not in str(exc):
                        raise
                await trio.sleep(0.5)

    async def _member_ids(self) -> dict[int, int]:
        """Member id -> index of the member at that peer URL."""
        index_of = {m.peer_url: m.index for m in self.members}
        result = await self.etcdctl("member", "list", "-w", "json")
        found: dict[int, int] = {}
        for entry in json.loads(result.stdout).get("members", []):
            for peer_url in entry.get("peerURLs", []):
                if peer_url in index_of:
                    found[int(entry["ID"])] = index_of[peer_url]
        return found


async def _nft(netns: str, args: list[str], stdin: str = "") -> None:
    argv = ["ip", "netns", "exec", netns, NFT_BIN, *args]
    with trio.fail_after(ETCDCTL_TIMEOUT):
        result = await trio.run_process(
            argv, stdin=stdin.encode(), capture_stdout=True, capture_stderr=True, check=False
        )
    if result.returncode != 0:
        err = result.stderr.decode(errors="replace").strip()
        raise ClusterError(f"nft {' '.join(args)} in {netns} exited {result.returncode}: {err}")
