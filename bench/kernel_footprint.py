#!/usr/bin/env python3
"""One daemon holding N-1 peers on kernel WireGuard and on wireguard-go, in the kernel guest.

This machine's kernel has no WireGuard, so the kernel data plane's footprint at
``--size`` ranks (run_all: 10,000) is measured in the guest of
``vnetd/lab/guest.py``, as ``kernel_guest.py`` measures its ratios: one boot,
both data planes in turn (kernel first). In the guest a lab of two pods runs
rank 0 of a ``--size``-rank mesh; ``register.py seed`` (from pod 1) registers
the other ranks first, with valid records and endpoints nobody answers, so the
daemon joins as the last rank of a job does and, by the one-initiator rule
(invariant 10), starts no handshake (``bench/footprint.py``'s last step, on
the host's wireguard-go). For each data plane, after the daemon's log shows
every peer and the device holds them (``wg show`` and ``ip route`` in the
daemon's namespaces), and a settle:

- the daemon's RSS and PSS (and wireguard-go's, on that plane);
- the kernel's memory taken since just before the start: ``/proc/meminfo``'s
  ``Slab`` and ``Percpu`` (the kernel's objects: the device's peers, their
  allowed IPs and the /32 routes, which both planes have), and ``MemAvailable``;
- the daemon's CPU from its start to the last peer, its time to the last peer,
  and its idle CPU over ``--idle`` s (the kernel's own work for a device at
  rest is not a process's and is not counted; no peer sends here).

Memory is the guest's and the host's alike (same kernel family, same code). TCG
runs Python about 20 times slower than the host, so the times and CPU seconds
are the guest's: compare the two planes, not the host's figures. The stop
(SIGTERM) removes the kernel link with its peers; it is bounded.

The host writes ``bench/results/kernel_footprint.json``. Where no guest can boot,
the script prints one line saying why and exits 0 without a result.

Run alone: ``.venv/bin/python bench/kernel_footprint.py --size 2000 --idle 10``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    RESULTS,
    JsonMesh,
    attempt,
    fmt_s,
    peers_held,
    plan_durations_ms,
    proc_cpu_seconds,
    wait_for,
    write_result,
)
from footprint import device_counts, memory
from guest_bench import run_script_in_guest, with_lab_retries

from vnetd.lab.cluster import write_spec
from vnetd.lab.netns import child_pid
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.spec import load_spec

NAME = "kernel_footprint"
TITLE = "One daemon at N-1 peers, kernel WireGuard and wireguard-go (kernel guest)"
OUTPUT = "kernel_footprint.json"
SCRIPT = Path(__file__).resolve()
DATAPLANES = ("kernel", "userspace")
LEASE_TTL = 120
"""The daemon's lease in the guest: its first pass over 9,999 peers takes about 1.5 s on
the host, so about 30 s under TCG, during which a keepalive can wait (kernel_guest.py's
30 s is for 1023 peers); an expired claim would restart the run."""
SEED_TIMEOUT = 900.0
"""Hang guard: registering 9,999 members from the guest (about 20 times the host's)."""
SEED_TTL = 7200
"""The seeded records' lease: above the whole guest run, so no member leaves in it."""
FULL_TIMEOUT = 1200.0
"""Hang guard: rank 0 reaching every peer (1023 took about 16 s in the guest)."""
STOP_TIMEOUT = 300.0
"""A daemon's SIGTERM before SIGKILL: it removes a kernel link with its peers."""
SETTLE = 10.0
GUEST_TIMEOUT = 5400.0
"""Above every hang guard of the run in the guest together (about 4,300 s), so a bound
missed inside is recorded as a failure there, not as a guest killed with the rest."""
BOOT_TIMEOUT = 400.0
MEMINFO = ("MemAvailable", "Slab", "SUnreclaim", "Percpu")


def meminfo() -> dict[str, int]:
    """The ``MEMINFO`` fields of ``/proc/meminfo``, KiB."""
    found = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in MEMINFO:
            found[key] = int(rest.split()[0])
    return found


async def seed(lab: Lab, spec_path: Path, last: int) -> float:
    """Register ranks 1..``last`` from pod 1; the seconds it took."""
    argv = [sys.executable, str(BENCH / "register.py"), "seed", "--etcd", lab.etcd_url,
            "--spec", str(spec_path), "--ranks", f"1-{last}",
            "--endpoint-base", "198.18.200.0", "--ttl", str(SEED_TTL)]  # fmt: skip
    started = time.monotonic()
    result = await lab.run(lab.pods[1], argv, SEED_TIMEOUT)
    if result.returncode != 0:
        raise RuntimeError(f"register.py seed: {result.stderr.decode(errors='replace')[:300]}")
    return time.monotonic() - started


async def one_plane(mesh: JsonMesh, dataplane: str, peers: int, idle: float) -> JSON:
    """Rank 0 started on ``dataplane`` with every member registered: its footprint."""
    await trio.sleep(SETTLE)  # the last plane's link and process are gone and freed
    before = meminfo()
    started = time.monotonic()
    await mesh.start_rank(0, "--dataplane", dataplane)
    try:
        await wait_for(lambda: len(peers_held(mesh.log(0))) >= peers,
                       f"{peers} peers on rank 0's {dataplane} device", FULL_TIMEOUT,
                       1.0)  # fmt: skip
        to_all = time.monotonic() - started
        pid = mesh.daemons[0].pid
        wg = child_pid(pid, "wireguard-go")
        cpu_to_all = proc_cpu_seconds(pid)
        wg_cpu_to_all = proc_cpu_seconds(wg) if wg else None
        await trio.sleep(SETTLE)
        after = meminfo()
        with trio.fail_after(120):
            counts = await device_counts(pid, mesh.spec.interface)
        mem = memory(pid)
        cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
        await trio.sleep(idle)
        idle_share = (proc_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    finally:
        try:
            await mesh.daemons[0].stop(timeout=STOP_TIMEOUT)
        finally:
            pod = mesh.pod(0)
            if (await mesh.lab.run(pod, ["ip", "link", "show", "vnet0"], 30)).returncode == 0:
                await mesh.lab.run(pod, ["ip", "link", "del", "vnet0"], 60)
    if counts["device_peers"] != peers:
        raise RuntimeError(f"{peers} peers logged, {counts['device_peers']} on the device")
    kernel_kib = {k: after[k] - before[k] for k in ("Slab", "SUnreclaim", "Percpu")}
    result: JSON = {
        "dataplane": dataplane,
        "peers": peers,
        "to_all_peers_s": round(to_all, 2),
        "cpu_to_all_peers_s": round(cpu_to_all, 3),
        "wg_cpu_to_all_peers_s": None if wg_cpu_to_all is None else round(wg_cpu_to_all, 3),
        "first_pass_ms": max(plan_durations_ms(mesh.log(0)), default=None),
        "idle_share": idle_share,
        "idle_s": idle,
        **mem,
        **counts,
        "kernel_slab_mib": kernel_kib["Slab"] / 1024,
        "kernel_unreclaimable_slab_mib": kernel_kib["SUnreclaim"] / 1024,
        "kernel_percpu_mib": kernel_kib["Percpu"] / 1024,
        "mem_available_drop_mib": (before["MemAvailable"] - after["MemAvailable"]) / 1024,
    }
    wg_text = f", wireguard-go {result['wg_rss_mib']:.1f} MiB" if result["wg_rss_mib"] else ""
    slab = result["kernel_slab_mib"]
    print(f"  {dataplane}: {peers} peers in {to_all:.1f} s (CPU {cpu_to_all:.1f} s); vnetd "
          f"{result['vnetd_rss_mib']:.1f} MiB{wg_text}; kernel slab +{slab:.1f}"
          f" MiB, percpu +{result['kernel_percpu_mib']:.1f} MiB; idle {idle_share:.2%}",
          flush=True)  # fmt: skip
    return result


async def inside(args: Any) -> int:  # noqa: ANN401 - argparse's namespace
    """In the guest: the lab, the seeding, each data plane in turn. The record goes to
    the share after each step, so a run cut short keeps what it measured."""
    share = Path(os.environ["VNETD_GUEST_SHARE"])
    record: JSON = {"runs": [], "failures": [], "seed_s": None,
                    "guest": {"kernel": platform.release(), "cpus": os.cpu_count()}}  # fmt: skip

    def write() -> None:
        (share / OUTPUT).write_text(json.dumps(record, default=str) + "\n")

    async def planes() -> JSON:
        async with open_lab(2) as lab:
            path = write_spec(lab.workdir / "mesh.toml", args.size, lab.etcd_url,
                              ttl=LEASE_TTL, name=f"lab{args.size}")  # fmt: skip
            mesh = JsonMesh(lab, path, load_spec(path))
            record["seed_s"] = await seed(lab, path, args.size - 1)
            print(f"{args.size - 1} members registered in {record['seed_s']:.1f} s", flush=True)
            write()
            for dataplane in args.dataplanes.split(","):
                run = await attempt(record["failures"], {"dataplane": dataplane},
                                    partial(one_plane, mesh, dataplane, args.size - 1,
                                            args.idle))  # fmt: skip
                if run is not None:
                    record["runs"].append(run)
                write()
        return {}

    await attempt(record["failures"], {"part": "lab"}, partial(with_lab_retries, planes))
    write()
    return len(record["failures"])


def summarize(runs: list[JSON]) -> JSON:
    by = {r["dataplane"]: r for r in runs}
    k, u = by.get("kernel"), by.get("userspace")
    ratio = None
    if k and u and u["cpu_to_all_peers_s"] and u.get("wg_cpu_to_all_peers_s") is not None:
        # The processes' CPU on each plane: vnetd (whose netlink calls carry the kernel's
        # work of adding peers and routes) against vnetd and its wireguard-go.
        ratio = k["cpu_to_all_peers_s"] / (u["cpu_to_all_peers_s"] + u["wg_cpu_to_all_peers_s"])
    return {"by_dataplane": by, "cpu_to_all_ratio": ratio}


async def on_host(args: Any) -> int:  # noqa: ANN401 - argparse's namespace
    options = ["--size", str(args.size), "--idle", str(args.idle),
               "--dataplanes", args.dataplanes]  # fmt: skip
    record = await run_script_in_guest(SCRIPT, options, OUTPUT, run_timeout=args.guest_timeout,
                                       boot_timeout=BOOT_TIMEOUT)  # fmt: skip
    if isinstance(record, int):
        return record
    inner, guest = record.inner, record.guest
    if record.returncode and not inner["failures"]:
        inner["failures"].append({"part": "guest", "error": f"exit {record.returncode}"})
    params = {"size": args.size, "peers": args.size - 1, "idle_s": args.idle,
              "dataplanes": args.dataplanes.split(","), "lease_ttl_s": LEASE_TTL,
              "seed_s": inner["seed_s"], "guest": guest}  # fmt: skip
    summary = summarize(inner["runs"])
    write_result(NAME, TITLE, params, inner["runs"], summary, record.load, args.out,
                 inner["failures"])  # fmt: skip
    print(
        f"kernel guest: boot {guest['boot_s']} s, wall {guest['wall_s']} s; CPU to every "
        f"peer, kernel / wireguard-go: {fmt_s(summary['cpu_to_all_ratio'])}",
        flush=True,
    )
    return 1 if inner["failures"] or record.returncode else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10000, help="mesh size (10000)")
    parser.add_argument("--idle", type=float, default=30.0, help="idle window, s (30)")
    parser.add_argument("--dataplanes", default=",".join(DATAPLANES),
                        help="in this order (kernel,userspace)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--guest-timeout", type=float, default=GUEST_TIMEOUT,
                        help=f"bound on the run in the guest, s ({GUEST_TIMEOUT:g})")  # fmt: skip
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (network namespaces, the guest)")
    if args.size < 2 or args.size > 10000:
        parser.error("--size: 2..10000 (the lab's overlay /16 and the seeded endpoints)")
    bad = set(args.dataplanes.split(",")) - set(DATAPLANES)
    if bad:
        parser.error(f"--dataplanes: {', '.join(sorted(bad))} is not one of {DATAPLANES}")
    sys.exit(1 if trio.run(inside if args.inside else on_host, args) else 0)


if __name__ == "__main__":
    main()
