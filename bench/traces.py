#!/usr/bin/env python3
"""Per-pod traces of a bench run, and the story of each slow pair read from them.

With ``--trace-dir DIR`` (``formation.py``, ``all_to_all.py``) every daemon's
wireguard-go runs with ``LOG_LEVEL=verbose`` (``VNETD_WIREGUARD_LOG``, read
by ``vnetd.dataplane.wireguard_go.supervise``), and before the lab is torn down each run
keeps, in ``DIR/<bench>-<size>-<run>/``: ``vnetd-R.log`` (the daemon's JSON
log), ``wireguard-go-R.log`` (its device's log: one-second timestamps, local
time), ``members.json`` (rank → public key and create revision in etcd) and
``pairs.json`` (each ordered pair's first answer, each daemon's start and,
for held probers, each one's go; epoch seconds).

Run alone, it prints what both ends of the slowest pairs logged about each other:

    .venv/bin/python bench/traces.py DIR/all_to_all-24-1 --slowest 5 --over 2
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from common import JSON, ClockMap, JsonMesh, json_log

from vnetd.control.membership import members_prefix, rank_of_key
from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR

_WG_LINE = re.compile(r"^[A-Z]+: (?:\(\S+\) )?(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) (.*)$")
"""``DEBUG: (vnet0) 2026/12/01 15:30:26 peer(abcd…wxyz) - Sending handshake initiation``"""


def add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-dir",
        type=Path,
        help="run wireguard-go with its verbose log and keep every pod's vnetd and "
        "wireguard-go logs here, one folder per run",
    )


def start_tracing(trace_dir: Path | None) -> None:
    """Have every daemon started from now on run its wireguard-go verbose."""
    if trace_dir is not None:
        os.environ["VNETD_WIREGUARD_LOG"] = "verbose"


async def keep_traces(
    mesh: JsonMesh,
    trace_dir: Path | None,
    label: str,
    reached: dict[tuple[int, int], float],
    clock: ClockMap,
    go: dict[int, float] | None = None,
) -> None:
    """Copy each rank's logs, etcd's member keys and the pairs' first answers
    (``reached``; ``go``: when each prober started sending, if held; monotonic) to
    ``trace_dir/label``; a no-op without a trace dir."""
    if trace_dir is None:
        return
    folder = trace_dir / label
    folder.mkdir(parents=True, exist_ok=True)
    device_log = f"{SOCKET_DIR}/{mesh.spec.interface}.log"
    for rank, daemon in sorted(mesh.daemons.items()):
        shutil.copyfile(daemon.log_path, folder / f"vnetd-{rank}.log")
        if daemon.returncode is None:
            result = await mesh.lab.run(mesh.pod(rank), ["cat", device_log], 60, beside=daemon)
            (folder / f"wireguard-go-{rank}.log").write_bytes(result.stdout)
    listing = await mesh.lab.etcdctl("get", "--prefix", members_prefix(mesh.spec), "-w", "json")
    members: JSON = {}
    for kv in json.loads(listing.stdout).get("kvs", []):
        rank = rank_of_key(mesh.spec, base64.b64decode(kv["key"]).decode())
        if rank is not None:
            record = json.loads(base64.b64decode(kv["value"]))
            members[str(rank)] = {
                "key": record["public_key"],
                "created": int(kv["create_revision"]),
            }
    (folder / "members.json").write_text(json.dumps(members, indent=1) + "\n")
    pairs = {f"{a}>{b}": clock.to_wall(t) for (a, b), t in sorted(reached.items())}
    started = {str(r): clock.to_wall(t) for r, t in mesh.started_at.items()}
    held = {str(r): clock.to_wall(t) for r, t in (go or {}).items()}
    (folder / "pairs.json").write_text(
        json.dumps({"reached": pairs, "started": started, "go": held}, indent=1) + "\n"
    )


# --- reading a trace --------------------------------------------------------------------


def short(key: str) -> str:
    """How wireguard-go names a peer in its log: ``peer(abcd…wxyz)``."""
    return f"{key[:4]}…{key[39:43]}"


def device_lines(path: Path) -> list[tuple[float, str]]:
    """``(epoch seconds, message)`` of each wireguard-go log line (whole seconds)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = _WG_LINE.match(line)
        if match:
            when = datetime.strptime(match.group(1), "%Y/%m/%d %H:%M:%S").timestamp()
            found.append((when, match.group(2)))
    return found


def story(folder: Path, a: int, b: int, members: dict[str, Any], since: float) -> list[str]:
    """What ``a``'s daemon and device logged about ``b`` (from ``since`` - 1 s on)."""
    out = []
    peer = short(members[str(b)]["key"])
    daemon = json_log((folder / f"vnetd-{a}.log").read_text(errors="replace"))
    for line in daemon:
        if line.t >= since - 1 and (f"rank {b}" in line.message or "claimed" in line.message):
            stamp = datetime.fromtimestamp(line.t).strftime("%H:%M:%S.%f")[:-3]
            out.append(f"  {stamp} vnetd: {line.message}")
    device = folder / f"wireguard-go-{a}.log"
    if device.exists():
        for when, message in device_lines(device):
            if when >= since - 1 and peer in message and "UAPI" not in message:
                out.append(f"  {datetime.fromtimestamp(when):%H:%M:%S}     wg: {message}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--slowest", type=int, default=5, help="also the N slowest pairs")
    parser.add_argument("--over", type=float, default=2.0, help="every pair over S s")
    parser.add_argument("--from", dest="origin", choices=("last-start", "both-ready"),
                        default="last-start",
                        help="what a pair's time counts from (both-ready: both ends ready "
                        "and the sender's prober sending)")  # fmt: skip
    args = parser.parse_args()
    members = json.loads((args.folder / "members.json").read_text())
    pairs = json.loads((args.folder / "pairs.json").read_text())
    last_start = max(pairs["started"].values())
    ready = {}
    for rank in members:
        lines = json_log((args.folder / f"vnetd-{rank}.log").read_text(errors="replace"))
        ready[int(rank)] = next(
            (x.t for x in lines if x.message.startswith(f"claimed rank {rank} as")), last_start
        )
    waits = {}
    for name, t in pairs["reached"].items():
        a, b = (int(x) for x in name.split(">"))
        go = pairs.get("go", {}).get(str(a), 0.0)  # a's prober held until then
        origin = last_start if args.origin == "last-start" else max(ready[a], ready[b], go)
        waits[(a, b)] = (t - origin, origin)
    ordered = sorted(waits.items(), key=lambda item: -item[1][0])
    chosen = [p for p in ordered if p[1][0] > args.over]
    print(f"{len(waits)} pairs; over {args.over:g} s: {len(chosen)}")
    chosen += [p for p in ordered[: args.slowest] if p not in chosen]
    for (a, b), (wait, origin) in chosen:
        print(f"\n== {a} > {b}: {wait:.2f} s ({a} created {members[str(a)]['created']}, "
              f"{b} created {members[str(b)]['created']})")  # fmt: skip
        for x, y in ((a, b), (b, a)):
            print(f" {x} about {y}:")
            print("\n".join(story(args.folder, x, y, members, origin)))


if __name__ == "__main__":
    main()
