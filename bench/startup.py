#!/usr/bin/env python3
"""Start-up: ``vnetd up`` starting → the rank's address on its interface, what a launcher waits on.

A lab of one pod and etcd; rank 0 of an 8-rank mesh starts ``--runs`` times
in a row (SIGTERM in between, so each start claims its rank anew), with the
lab's defaults (``--dataplane auto``, no HTTP listener). The clock starts just
before the lab spawns the daemon's process (its ``ip netns exec``/``unshare``
wrapper included) and stops when the pod's kernel announces the rank's address
on ``vnet0``: an ``ip -o monitor address`` in the pod's namespace, started
before the daemon, reports it, so nothing polls and the measured daemon has
both cores to itself apart from that one idle reader. The first run also
creates the private key. From the daemon's JSON log each run also gets when
it logged ``starting:`` (imports, settings and identity done), its data plane
choice, and its claim, to say where the time goes; and the CPU time the
daemon's process had used when the address appeared (read within about 5 ms of
it, in clock ticks of 10 ms), a figure a loaded machine changes less.

After the starts, as many bare interpreters (``FLOOR``) import the libraries a
daemon needs before its claim and nothing of vnetd: trio, httpx with httpcore
(without anyio and h2, as ``registry.etcd.httpcore_package`` imports it),
cryptography's X25519 and Ed25519, and the standard modules the daemon uses.
Their CPU (``floor_cpu_s``, from ``wait4``'s resource usage) is what those
imports cost on this machine by themselves: the CPU to the claim cannot fall
below it without dropping a library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    JsonMesh,
    LoadSampler,
    base_parser,
    check_host,
    claim_time,
    lab_netns,
    merge_load,
    proc_cpu_seconds,
    run_repeated,
    runs_for,
    spread,
    wait_for,
    write_result,
)

from vnetd.lab.cluster import monotonic_of, write_spec
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.spec import load_spec

NAME = "startup"
TITLE = "Start-up of one daemon"
SIZE = 8
BOUND = 20.0
"""Seconds one start may take before the run counts as failed."""
FLOOR = """
import sys
skipped = [name for name in ("anyio", "h2") if name not in sys.modules]
for name in skipped:
    sys.modules[name] = None
import httpcore
for name in skipped:
    del sys.modules[name]
import httpx, trio
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
import argparse, base64, dataclasses, ipaddress, json, logging, os, pathlib, random
import signal, socket, struct, tomllib
"""
"""What a daemon imports before its claim, less vnetd itself (module docstring)."""


def floor_cpu() -> float:
    """CPU seconds (user + system) of one bare interpreter importing ``FLOOR``."""
    child = subprocess.Popen([sys.executable, "-c", FLOOR])
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"the floor's imports failed (exit {child.returncode})")
    return usage.ru_utime + usage.ru_stime


async def address_seen(lab: Lab, netns: str, address: str, seen: list[float]) -> None:
    """Append the monotonic time at which ``address`` is announced in ``netns``."""
    process = await trio.lowlevel.open_process(
        ["ip", "-n", netns, "-o", "-4", "monitor", "address"],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    buffer = b""
    try:
        async for chunk in process.stdout:
            buffer += chunk
            if f" {address}/".encode() in buffer and b"Deleted" not in buffer:
                seen.append(time.monotonic())
                return
            buffer = buffer.rpartition(b"\n")[2]
    finally:
        process.kill()
        await process.wait()


async def one_start(lab: Lab, mesh: JsonMesh, run: int) -> JSON:
    pod = lab.pods[0]
    seen: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(address_seen, lab, pod.netns, mesh.address(0), seen)
        await trio.sleep(0.3)  # the monitor has subscribed
        started = time.monotonic()
        process = await mesh.start_rank(0)
        await wait_for(lambda: seen, "the address on vnet0", BOUND, 0.005)
        cpu_at_address = proc_cpu_seconds(process.pid)  # within ~5 ms of it
    address_s = seen[0] - started
    await wait_for(lambda: claim_time(mesh.log(0), 0) is not None, "the claim", BOUND, 0.01)
    cpu_at_claim = proc_cpu_seconds(process.pid)  # within ~10 ms of its log line
    lines = mesh.log(0)

    def since(prefix: str) -> float | None:
        t = next((line.t for line in lines if line.message.startswith(prefix)), None)
        return None if t is None else monotonic_of(t) - started

    claimed = claim_time(lines, 0)
    result = {
        "run": run,
        "new_key": run == 0,
        "address_s": address_s,
        "cpu_at_address_s": cpu_at_address,
        "cpu_at_claim_s": cpu_at_claim,
        "logged_starting_s": since("starting: "),
        "dataplane_chosen_s": since("data plane: "),
        "claimed_s": None if claimed is None else monotonic_of(claimed) - started,
    }
    await process.stop()
    print(
        f"  run {run + 1}: address after {address_s * 1000:.0f} ms, "
        f"{cpu_at_address * 1000:.0f} ms of CPU "
        f"(starting: logged at {(result['logged_starting_s'] or 0) * 1000:.0f} ms, "
        f"claimed at {(result['claimed_s'] or 0) * 1000:.0f} ms, "
        f"{cpu_at_claim * 1000:.0f} ms of CPU)",
        flush=True,
    )
    return result


async def one_lab(runs: int, profile: Path | None) -> JSON:
    async with open_lab(1) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            path = write_spec(lab.workdir / "mesh.toml", SIZE, lab.etcd_url, ttl=10)
            mesh = JsonMesh(lab, path, load_spec(path))
            if profile is not None:
                mesh.program = [sys.executable, str(BENCH / "profile_up.py"), str(profile)]
            starts = [await one_start(lab, mesh, i) for i in range(runs)]
            for start in starts:
                start["floor_cpu_s"] = await trio.to_thread.run_sync(floor_cpu)
            print("  the libraries alone: "
                  + ", ".join(f"{s['floor_cpu_s'] * 1000:.0f}" for s in starts)
                  + " ms of CPU", flush=True)  # fmt: skip
            nursery.cancel_scope.cancel()
    return {"starts": starts, "load": sampler.summary()}


def summarize(starts: list[JSON]) -> JSON:
    keys = ("address_s", "cpu_at_address_s", "logged_starting_s", "dataplane_chosen_s",
            "claimed_s", "cpu_at_claim_s", "floor_cpu_s")  # fmt: skip
    again = [s for s in starts if not s["new_key"]]
    return {
        "all": {key: spread(s[key] for s in starts) for key in keys},
        "key_kept": {key: spread(s[key] for s in again) for key in keys},
        "target_address_s": 0.35,
        "target_cpu_at_claim_s": 0.12,
    }


async def main_async(args: Any) -> int:  # noqa: ANN401
    n = runs_for(args.runs)
    labs, failures = await run_repeated("startup", 1, lambda _i: one_lab(n, args.profile))
    starts = [s for lab in labs for s in lab["starts"]]
    params = {"runs": n, "mesh_size": SIZE, "lease_ttl_s": 10, "profiled": bool(args.profile)}
    write_result(NAME, TITLE, params, starts, summarize(starts),
                 merge_load([lab["load"] for lab in labs]), args.out, failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(1,), runs=7)
    parser.add_argument("--profile", type=Path, help="run each start under cProfile up to "
                        "its claim (bench/profile_up.py), leaving DIR/up-<pid>.prof")  # fmt: skip
    args = parser.parse_args()
    check_host()
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
