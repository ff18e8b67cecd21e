"""vnetd ranks in the lab: a spec, a daemon and a UDP probe per pod.

Used by the end-to-end tests and by ``vnetd demo``. Each pod runs
``vnetd up`` (with ``POD_IP`` and ``POD_NAME`` set as Kubernetes would) and
a probe that pings every rank's fixed overlay address every 100 ms, so
"rank a reaches rank b" means a packet went from a to b over the overlay
and the answer came back. Probe timestamps are ``time.monotonic()``,
shared by every process on the machine, so they compare with the test's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from vnetd.lab.lab import Lab, LabProcess, Pod
from vnetd.lab.probe import parse_events, probe_command
from vnetd.spec import MeshSpec, load_spec

OVERLAY = "10.250.0.0/16"
PROBE_DURATION = 600.0


def write_spec(path: Path, size: int, etcd_url: str, *, name: str = "lab", ttl: int = 5) -> Path:
    path.write_text(
        f"""[mesh]
name = "{name}"
size = {size}
network = "{OVERLAY}"
port = 51820
interface = "vnet0"
mtu = 1420
hostname = "{name}-{{rank}}"

[registry]
endpoints = ["{etcd_url}"]
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
        path = write_spec(lab.workdir / "mesh.toml", len(lab.pods), lab.etcd_url, ttl=ttl)
        return cls(lab, path, load_spec(path))

    def pod(self, rank: int) -> Pod:
        return self.lab.pods[rank]

    def address(self, rank: int) -> str:
        return str(self.spec.address(rank))

    async def start_rank(self, rank: int, *extra: str) -> LabProcess:
        """Start ``vnetd up`` for ``rank`` in its pod."""
        pod = self.pod(rank)
        argv = [
            sys.executable, "-m", "vnetd", "up",
            "--config", str(self.spec_path),
            "--rank", str(rank),
            "--state-dir", str(pod.state_dir),
            *extra,
        ]  # fmt: skip
        env = {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name}
        self.started_at[rank] = time.monotonic()
        process = await self.lab.start(pod, argv, env)
        self.daemons[rank] = process
        return process

    async def start_probes(self, duration: float = PROBE_DURATION) -> None:
        """One probe per pod, targeting every rank's overlay address."""
        targets = [self.address(r) for r in range(self.spec.size)]
        for rank in range(self.spec.size):
            argv = probe_command(self.address(rank), targets, duration=duration)
            self.probes[rank] = await self.lab.start(self.pod(rank), argv, private_mount=False)

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

    def dead_daemons(self) -> dict[int, int]:
        return {r: p.returncode for r, p in self.daemons.items() if p.returncode is not None}
