"""What ``vnetd demo`` runs: build the netns lab, start N ranks in a random order, watch
the mesh form.

Everything runs on this machine inside network namespaces the demo makes
(pods, a switch, an etcd host) and is torn down on exit or Ctrl-C. The
command's parser is ``vnetd.commands.demo``.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time

import trio

from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR
from vnetd.errors import VnetdError
from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import open_lab

TOOLS = ("ip", "unshare", "nsenter", "etcd", "wireguard-go")
STATUS_TIMEOUT = 30.0


def check_host() -> None:
    if os.geteuid() != 0:
        raise VnetdError("demo: needs root to create network namespaces (run it with sudo)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise VnetdError(f"demo: missing {', '.join(missing)}; run scripts/setup first")
    if not os.path.exists("/dev/net/tun"):
        raise VnetdError("demo: /dev/net/tun is missing; wireguard-go needs it")


class Progress:
    """One status line, redrawn in place on a terminal, printed on change otherwise."""

    def __init__(self, total_pairs: int, t0: float) -> None:
        self.total = total_pairs
        self.t0 = t0
        self.tty = sys.stdout.isatty()
        self.last = ""
        self.started = 0
        self.ranks = 0

    def update(self, missing: list[tuple[int, int]]) -> None:
        line = (
            f"[{time.monotonic() - self.t0:6.2f}s] ranks started {self.started}/{self.ranks}, "
            f"pairs reaching each other {self.total - len(missing)}/{self.total}"
        )
        if line[10:] == self.last[10:]:
            if self.tty:
                print("\r" + line, end="", flush=True)
            return
        self.last = line
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", flush=True)

    def say(self, text: str) -> None:
        print(("\r\033[K" if self.tty else "") + text, flush=True)


async def run_demo(ranks: int, max_gap: float, seed: int | None, limit: float) -> int:
    if not 2 <= ranks <= 200:
        raise VnetdError(f"--ranks: {ranks} is out of range (2..200)")
    if not 0 <= max_gap <= 60:
        raise VnetdError(f"--max-gap: {max_gap} is out of range (0..60)")
    check_host()
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    order = list(range(ranks))
    rng.shuffle(order)
    print(f"vnetd demo: {ranks} ranks, start order {order} (seed {seed})")
    async with open_lab(ranks) as lab:
        mesh = MeshLab.create(lab)
        print(f"lab {lab.id}: {ranks} pods on 198.18.0.0/15, etcd at {lab.etcd_url}")
        print(
            f"overlay {mesh.spec.network}: rank 0 is {mesh.address(0)}, "
            f"rank {ranks - 1} is {mesh.address(ranks - 1)}"
        )
        await mesh.start_probes()
        t0 = time.monotonic()
        progress = Progress(ranks * (ranks - 1), t0)
        progress.ranks = ranks
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_show_progress, mesh, progress)
            for rank in order:
                await mesh.start_rank(rank)
                progress.started += 1
                progress.say(
                    f"[{time.monotonic() - t0:6.2f}s] started rank {rank} "
                    f"({mesh.address(rank)}) in {mesh.pod(rank).name}"
                )
                await trio.sleep(rng.uniform(0, max_gap))
            last_start = max(mesh.started_at.values())
            try:
                full_at = await mesh.wait_full_mesh(limit, on_progress=progress.update)
            except trio.TooSlowError as exc:
                progress.say(f"demo: {exc}")
                _print_matrix(mesh)
                nursery.cancel_scope.cancel()
                return 1
            nursery.cancel_scope.cancel()
        progress.say("")
        _print_matrix(mesh)
        print(
            f"full mesh: all {ranks * (ranks - 1)} ordered pairs reach each other over the "
            f"overlay, {full_at - last_start:.2f} s after the last start "
            f"({full_at - t0:.2f} s after the first)"
        )
        await _print_status(mesh)
        print("tearing the lab down")
    leftovers = _leftovers(lab.netns_names, [p.pid for p in lab.processes])
    if leftovers:
        print(f"demo: teardown left {leftovers}", file=sys.stderr)
        return 1
    print("done: no namespace, bridge or process of the demo is left")
    return 0


async def _print_status(mesh: MeshLab) -> None:
    """``vnetd status`` as run inside pod 0, beside rank 0's daemon (so with its device)."""
    argv = [
        sys.executable, "-m", "vnetd", "status",
        "--config", str(mesh.spec_path),
        "--wireguard-dir", SOCKET_DIR,
    ]  # fmt: skip
    print(f"$ vnetd status --config {mesh.spec_path.name}   (in {mesh.pod(0).name}, beside rank 0)")
    try:
        result = await mesh.lab.run(mesh.pod(0), argv, STATUS_TIMEOUT, beside=mesh.daemons[0])
    except trio.TooSlowError:
        print(f"demo: vnetd status gave no answer within {STATUS_TIMEOUT:g} s", file=sys.stderr)
        return
    print(result.stdout.decode(), end="")
    if result.returncode != 0:
        print(f"demo: vnetd status exited {result.returncode}: {result.stderr.decode()}", end="")


def _leftovers(netns: list[str], pids: list[int]) -> str:
    existing = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    left_ns = sorted(existing & set(netns))
    left_pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    parts = [f"namespaces {left_ns}"] * bool(left_ns) + [f"pids {left_pids}"] * bool(left_pids)
    return ", ".join(parts)


async def _show_progress(mesh: MeshLab, progress: Progress) -> None:
    while True:
        progress.update(mesh.missing_pairs())
        await trio.sleep(0.5)


def _print_matrix(mesh: MeshLab) -> None:
    size = mesh.spec.size
    if size > 32:
        return
    reached = mesh.first_reached()
    print("reach matrix (row reaches column; # yes, . no):")
    print("      " + "".join(f"{b % 10}" for b in range(size)))
    for a in range(size):
        cells = "".join(" " if a == b else ("#" if (a, b) in reached else ".") for b in range(size))
        print(f"  {a:3d} {cells}")
