#!/usr/bin/env python3
"""``vnetd doctor``'s wall time and registry cost at 8, 32 and 64 ranks.

For each size, one netns lab (one real etcd, per pod one ``vnetd up`` and its
wireguard-go) forms a full mesh (the lab's UDP probes have crossed every ordered
pair; they are stopped then); then ``vnetd doctor --json`` runs in pod 0
and etcd's /metrics is scraped (from pod 1) just before and just after it.
Reported: the doctor's wall time (the process, start to exit) and its own
``elapsed_s``; the gRPC messages etcd received during the run, by method, and
etcd's CPU seconds; and the same two over an equal idle window before the run
(the daemons' own lease keepalives), so the doctor's share is the difference.

    bench/doctor.py --sizes 8,32,64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio
from common import read_result, write_result
from etcd_metrics import parse

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import open_lab

FORM = 240.0
"""Bound on forming the mesh (64 Python daemons on 2 loaded cores take minutes); a mesh
not full by then is measured anyway, with the pairs the lab's probes missed."""
DOCTOR_TIMEOUT = 60.0
SCRAPE = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=5).read().decode())"
)


async def scrape(mesh: MeshLab) -> dict[str, Any]:
    result = await mesh.lab.run(mesh.pod(1), [sys.executable, "-c", SCRAPE, mesh.lab.etcd_url], 15)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.decode())
    return parse(result.stdout.decode())


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    received = {
        method: after["received"].get(method, 0) - before["received"].get(method, 0)
        for method in after["received"]
    }
    return {
        "received": {m: n for m, n in received.items() if n},
        "range": after["mvcc"].get("range", 0) - before["mvcc"].get("range", 0),
        "cpu_s": round(after["cpu"] - before["cpu"], 3),
    }


async def wait_formed(mesh: MeshLab) -> float:
    """Until the lab's own UDP probes have crossed every ordered pair, then stop them
    (their traffic would load the run measured)."""
    start = time.monotonic()
    try:
        await mesh.wait_full_mesh(FORM)
    except trio.TooSlowError as exc:
        print(f"not full, measured anyway: {exc}", flush=True)
    for probe in mesh.probes.values():
        await probe.stop()
    return time.monotonic() - start


async def one(size: int) -> dict[str, Any]:
    async with open_lab(size, static_neighbours=True) as lab:
        mesh = MeshLab.create(lab, ttl=10)
        await mesh.start_probes()
        for rank in range(size):
            await mesh.start_rank(rank)
        formed = await wait_formed(mesh)
        missing = mesh.missing_pairs()
        await trio.sleep(5)  # let the joins' last passes settle
        argv = [sys.executable, "-m", "vnetd", "doctor", "--config", str(mesh.spec_path),
                "--json", "--timeout", str(DOCTOR_TIMEOUT)]  # fmt: skip
        idle_before = await scrape(mesh)
        load = os.getloadavg()[0]
        start = time.monotonic()
        result = await lab.run(mesh.pod(0), argv, DOCTOR_TIMEOUT + 30)
        wall = time.monotonic() - start
        after = await scrape(mesh)
        await trio.sleep(wall)
        idle_after = await scrape(mesh)
        doc = json.loads(result.stdout)
        run = {
            "size": size,
            "formed_s": round(formed, 2),
            "load_1m": load,
            "lab_probe_missing": missing,
            "exit": result.returncode,
            "wall_s": round(wall, 3),
            "elapsed_s": doc["elapsed_s"],
            "failing": len(doc["failing"]),
            "causes": doc["causes"],
            "answered": len(doc["answered"]),
            "example": doc["failing"][0] if doc["failing"] else None,
            "working": len(doc["working"]),
            "registry_during": delta(after, idle_before),
            "registry_idle_same_span": delta(idle_after, after),
        }
        print(json.dumps(run), flush=True)
        return run


async def main(sizes: list[int], merge: bool) -> None:
    runs = [await one(size) for size in sizes]
    if merge and (old := read_result("doctor")) is not None:
        runs += [r for r in old["runs"] if r["size"] not in sizes]
        runs.sort(key=lambda r: r["size"])
    summary = {str(r["size"]): {"wall_s": r["wall_s"], "failing": r["failing"],
                                "range_during": r["registry_during"]["range"],
                                "etcd_cpu_during": r["registry_during"]["cpu_s"],
                                "etcd_cpu_idle": r["registry_idle_same_span"]["cpu_s"]}
               for r in runs}  # fmt: skip
    write_result("doctor", "vnetd doctor: wall time and registry cost", {"sizes": sizes},
                 runs, summary, {})  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,32,64")
    parser.add_argument(
        "--merge", action="store_true", help="keep the other sizes of the last result"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    trio.run(main, [int(s) for s in args.sizes.split(",")], args.merge)
