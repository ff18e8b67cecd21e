"""vnetd ranks in the lab: a spec, a daemon and a UDP probe per pod.

Used by the end-to-end tests and by ``vnetd demo``. Each pod runs
``vnetd up`` (with ``POD_IP`` and ``POD_NAME`` set as Kubernetes would) and
a probe that pings every rank's fixed overlay address every 100 ms, so
"rank a reaches rank b" means a packet went from a to b over the overlay
and the answer came back. Probe timestamps are ``time.monotonic()``,
shared by every process on the machine, so they compare with the test's;
the daemons' log lines carry the wall clock (ms), which ``claimed_at``
turns into the same monotonic time.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from vnetd.control.membership import members_prefix, rank_of_key
from vnetd.lab.netns import child_pid
from vnetd.lab.open_lab import Lab, LabError, LabProcess, Pod
from vnetd.lab.probe import parse_events, probe_command
from vnetd.spec import MeshSpec, load_spec

OVERLAY = "10.250.0.0/16"
PROBE_DURATION = 600.0
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) vnetd rank=\S+ [A-Z]+ (.*)$")
"""A line of the daemon's text log: local time to the millisecond, then the message."""
_HTTP_GET = (
    "import ssl, sys, urllib.request, urllib.error\n"
    "unverified = ssl._create_unverified_context()  # as a kubelet's HTTPS probe\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=3, context=unverified)\n"
    "    print(r.status); sys.stdout.write(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); sys.stdout.write(e.read().decode())\n"
)


async def http_get(lab: Lab, pod: Pod, url: str) -> tuple[int, str]:
    """GET ``url`` from inside ``pod`` (a daemon's ``--http-listen`` on its loopback, as
    a kubelet probe would, an ``https`` one without checking the certificate): (status,
    body), or (0, why) when nothing answers."""
    result = await lab.run(pod, [sys.executable, "-c", _HTTP_GET, url], 10)
    if result.returncode != 0:
        return 0, result.stderr.decode(errors="replace")[-200:]
    status, _, body = result.stdout.decode().partition("\n")
    return int(status), body


def log_lines(process: LabProcess) -> list[tuple[float, str]]:
    """``(wall-clock time, message)`` of each text-format log line the daemon wrote so far."""
    lines = []
    for line in process.log_text().splitlines():
        match = _LOG_LINE.match(line)
        if match:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            lines.append((stamp, match.group(2)))
    return lines


def monotonic_of(wall: float) -> float:
    """A ``time.time()`` instant as ``time.monotonic()`` (both clocks of this machine)."""
    return wall - (time.time() - time.monotonic())


@dataclass(frozen=True)
class Formation:
    """How a mesh formed, in ``time.monotonic()`` seconds (``MeshLab.formation``)."""

    first_start: float
    last_start: float
    last_claim: float
    """When the last daemon logged its claim: from then on every peer may learn of it."""
    probes_started: float
    """When the last probe listened (a pair cannot be reached before)."""
    full: float
    """When the last ordered pair was first reached."""

    @property
    def since_first_start(self) -> float:
        return self.full - self.first_start

    @property
    def after_claim(self) -> float:
        """The last pair's wait once the last daemon had claimed and the probes ran:
        the handshakes, without the daemons' start-up (the part load stretches)."""
        return self.full - max(self.last_claim, self.probes_started)

    def __str__(self) -> str:
        return (
            f"full mesh {self.since_first_start:.2f} s after the first start, "
            f"{self.full - self.last_start:.2f} s after the last, "
            f"{self.after_claim:.2f} s after the last claim"
        )


def write_spec(
    path: Path,
    size: int,
    etcd_url: str | Sequence[str],
    *,
    name: str = "lab",
    ttl: int = 5,
    mtu: int = 1420,
) -> Path:
    """Write the lab's spec; ``etcd_url`` is one URL or every member's."""
    urls = [etcd_url] if isinstance(etcd_url, str) else list(etcd_url)
    path.write_text(
        f"""[mesh]
name = "{name}"
size = {size}
network = "{OVERLAY}"
port = 51820
interface = "vnet0"
mtu = {mtu}
hostname = "{name}-{{rank}}"

[registry]
endpoints = {json.dumps(urls)}
lease_ttl = {ttl}
"""
    )
    return path


@dataclass
class MeshLab:
    """A lab whose pod ``i`` runs rank ``i``."""

    lab: Lab
    spec_path: Path
    spec: MeshSpec
    daemons: dict[int, LabProcess] = field(default_factory=dict)
    probes: dict[int, LabProcess] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)

    @classmethod
    def create(cls, lab: Lab, *, ttl: int = 5) -> MeshLab:
        path = write_spec(lab.workdir / "mesh.toml", len(lab.pods), lab.etcd_urls, ttl=ttl)
        return cls(lab, path, load_spec(path))

    def pod(self, rank: int) -> Pod:
        return self.lab.pods[rank]

    def address(self, rank: int) -> str:
        return str(self.spec.address(rank))

    async def start_rank(self, rank: int, *extra: str, config: Path | None = None) -> LabProcess:
        """Start ``vnetd up`` for ``rank`` in its pod (with ``config`` instead of the
        mesh's spec, if given)."""
        pod = self.pod(rank)
        argv = [
            sys.executable, "-m", "vnetd", "up",
            "--config", str(config or self.spec_path),
            "--rank", str(rank),
            "--state-dir", str(pod.state_dir),
            *extra,
        ]  # fmt: skip
        env = {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name}
        self.started_at[rank] = time.monotonic()
        process = await self.lab.start(pod, argv, env)
        self.daemons[rank] = process
        return process

    async def start_probes(
        self,
        duration: float = PROBE_DURATION,
        *,
        report_every: float = 0.0,
        lost_after: float | None = None,
    ) -> None:
        """One probe per pod, targeting every rank's overlay address.

        Args:
            report_every: have each probe print its counters this often (for
                ``probe_received``); 0 = never.
            lost_after: the silence (s) after which a probe reports a target
                ``lost``; None keeps the probe's default (1 s).
        """
        targets = [self.address(r) for r in range(self.spec.size)]
        for rank in range(self.spec.size):
            argv = probe_command(
                self.address(rank), targets, duration=duration, report_every=report_every,
                lost_after=lost_after,
            )  # fmt: skip
            self.probes[rank] = await self.lab.start(self.pod(rank), argv, private_mount=False)

    def probe_misses(
        self, since: float, until: float = math.inf, ranks: set[int] | None = None
    ) -> dict[tuple[int, int], int]:
        """Probe requests lost per ordered pair among ``ranks``, counting those sent
        in [since, until] (monotonic) once the pair had answered at least once.

        A request counts as lost when no reply came within the probe's
        ``--miss-after`` (1 s): read this at least that long after ``until``.
        Only pairs with a loss are in the result.
        """
        misses: dict[tuple[int, int], int] = {}
        for (src, dst), event in self._probe_events("miss", ranks):
            if since <= float(event["sent"]) <= until:
                misses[(src, dst)] = misses.get((src, dst), 0) + 1
        return misses

    def probe_received(
        self, since: float, until: float, ranks: set[int] | None = None
    ) -> dict[tuple[int, int], int]:
        """Replies per ordered pair among ``ranks`` between the first counters
        report at or after ``since`` and the last at or before ``until`` (needs
        probes started with ``report_every``)."""
        first: dict[tuple[int, int], int] = {}
        last: dict[tuple[int, int], int] = {}
        for pair, event in self._probe_events("counters", ranks):
            if since <= float(event["t"]) <= until:
                received = int(event["received"][self.address(pair[1])])
                first.setdefault(pair, received)
                last[pair] = received
        return {pair: last[pair] - first[pair] for pair in first}

    def _probe_events(
        self, kind: str, ranks: set[int] | None
    ) -> list[tuple[tuple[int, int], dict[str, Any]]]:
        """``((src, dst), event)`` for each probe event of ``kind`` about a target in ``ranks``
        (``counters`` events are repeated once per target)."""
        ranks = set(range(self.spec.size)) if ranks is None else ranks
        rank_of = {self.address(r): r for r in ranks}
        found: list[tuple[tuple[int, int], dict[str, Any]]] = []
        for src, probe in sorted(self.probes.items()):
            if src not in ranks:
                continue
            for event in parse_events(probe.log_text()):
                if event.get("event") != kind:
                    continue
                if kind == "counters":
                    targets = [a for a in event.get("received", {}) if a in rank_of]
                else:
                    targets = [event["target"]] if event.get("target") in rank_of else []
                found.extend(((src, rank_of[a]), event) for a in targets)
        return found

    def first_reached(self) -> dict[tuple[int, int], float]:
        """For each ordered pair (a, b): when a first got an answer from b."""
        rank_of = {self.address(r): r for r in range(self.spec.size)}
        reached: dict[tuple[int, int], float] = {}
        for src, probe in self.probes.items():
            for event in parse_events(probe.log_text()):
                if event.get("event") == "reached" and event.get("target") in rank_of:
                    pair = (src, rank_of[event["target"]])
                    reached.setdefault(pair, float(event["t"]))
        return reached

    def missing_pairs(self, ranks: set[int] | None = None) -> list[tuple[int, int]]:
        ranks = set(range(self.spec.size)) if ranks is None else ranks
        reached = self.first_reached()
        return [
            (a, b) for a in sorted(ranks) for b in sorted(ranks) if a != b and (a, b) not in reached
        ]

    async def wait_full_mesh(
        self,
        timeout: float,  # noqa: ASYNC109 (a bound the caller states)
        ranks: set[int] | None = None,
        *,
        on_progress: Callable[[list[tuple[int, int]]], None] | None = None,
    ) -> float:
        """Wait until every ordered pair of ``ranks`` has reached the other.

        Returns:
            The monotonic time the last pair was first reached.

        Raises:
            trio.TooSlowError: not full within ``timeout`` s; the message
                lists the missing pairs and which daemons have exited.
        """
        deadline = trio.current_time() + timeout
        while True:
            missing = self.missing_pairs(ranks)
            if on_progress is not None:
                on_progress(missing)
            if not missing:
                return max(self.first_reached().values(), default=time.monotonic())
            if trio.current_time() > deadline:
                dead = {
                    r: p.returncode for r, p in self.daemons.items() if p.returncode is not None
                }
                raise trio.TooSlowError(
                    f"mesh not full after {timeout:.0f} s: {len(missing)} pairs missing, "
                    f"e.g. {missing[:6]}; exited daemons: {dead or 'none'}"
                )
            await trio.sleep(0.1)

    def claimed_at(self, rank: int) -> float | None:
        """When ``rank``'s current daemon logged its (last) claim, monotonic; None before."""
        prefix = f"claimed rank {rank} "
        found = [t for t, message in log_lines(self.daemons[rank]) if message.startswith(prefix)]
        return monotonic_of(found[-1]) if found else None

    def probes_started(self, ranks: set[int] | None = None) -> float:
        """When the last probe among ``ranks`` listened (its ``started`` event).

        Raises:
            LabError: a probe has not started (yet).
        """
        ranks = set(range(self.spec.size)) if ranks is None else ranks
        started = []
        for rank in sorted(ranks):
            events = parse_events(self.probes[rank].log_text()) if rank in self.probes else []
            times = [float(e["t"]) for e in events if e.get("event") == "started"]
            if not times:
                raise LabError(f"rank {rank}'s probe has not started")
            started.append(times[0])
        return max(started)

    def formation(self, ranks: set[int] | None = None) -> Formation:
        """How the mesh among ``ranks`` formed; call it once ``wait_full_mesh`` returned.

        Raises:
            LabError: a daemon has not claimed, a probe has not started, or a
                pair has not been reached.
        """
        ranks = set(range(self.spec.size)) if ranks is None else ranks
        if missing := self.missing_pairs(ranks):
            raise LabError(f"pairs not reached yet: {missing[:6]}")
        claims = {rank: self.claimed_at(rank) for rank in sorted(ranks)}
        if unclaimed := [rank for rank, t in claims.items() if t is None]:
            raise LabError(f"ranks {unclaimed} have not logged a claim")
        reached = self.first_reached()
        return Formation(
            first_start=min(self.started_at[r] for r in ranks),
            last_start=max(self.started_at[r] for r in ranks),
            last_claim=max(t for t in claims.values() if t is not None),
            probes_started=self.probes_started(ranks),
            full=max(t for (a, b), t in reached.items() if a in ranks and b in ranks),
        )

    def dead_daemons(self) -> dict[int, int]:
        return {r: p.returncode for r, p in self.daemons.items() if p.returncode is not None}

    def wireguard_go_pid(self, rank: int) -> int:
        """The pid of the wireguard-go child of ``rank``'s daemon.

        Raises:
            LabError: the daemon has no such child (now).
        """
        daemon = self.daemons[rank].pid
        pid = child_pid(daemon, "wireguard-go")
        if pid is None:
            raise LabError(f"rank {rank}'s daemon (pid {daemon}) has no wireguard-go child")
        return pid

    async def device_dump(self, rank: int) -> list[list[str]]:
        """``wg show <if> dump`` of ``rank``'s device, run beside its daemon: one row
        per peer (public key, preshared key, endpoint, allowed IPs, ...)."""
        result = await self.lab.run(
            self.pod(rank), ["wg", "show", self.spec.interface, "dump"], 10,
            beside=self.daemons[rank],
        )  # fmt: skip
        if result.returncode != 0:
            raise LabError(f"wg show in pod {rank}: {result.stderr.decode(errors='replace')}")
        return [line.split("\t") for line in result.stdout.decode().splitlines()[1:]]

    async def device_peers(self, rank: int) -> dict[str, list[str]]:
        """``rank``'s device: public key -> allowed IPs of each peer."""
        return {
            row[0]: sorted(row[3].split(",")) if row[3] != "(none)" else []
            for row in await self.device_dump(rank)
        }

    async def device_endpoints(self, rank: int) -> dict[int, str]:
        """The endpoint ``rank``'s device has for each peer rank (``(none)`` if unset)."""
        rank_of = {f"{self.address(r)}/32": r for r in range(self.spec.size)}
        return {
            rank_of[ip]: row[2]
            for row in await self.device_dump(rank)
            for ip in row[3].split(",")
            if ip in rank_of
        }

    async def device_ranks(self, rank: int) -> set[int]:
        """The ranks whose /32 is on ``rank``'s device (each peer holds one)."""
        rank_of = {f"{self.address(r)}/32": r for r in range(self.spec.size)}
        peers = await self.device_peers(rank)
        return {rank_of[ip] for ips in peers.values() for ip in ips if ip in rank_of}

    async def registered_ranks(self) -> set[int]:
        """The ranks whose ``members/<rank>`` key is in etcd now."""
        result = await self.lab.etcdctl("get", "--prefix", "--keys-only", members_prefix(self.spec))
        ranks = (rank_of_key(self.spec, key) for key in result.stdout.decode().split())
        return {rank for rank in ranks if rank is not None}
