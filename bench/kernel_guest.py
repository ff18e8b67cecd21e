#!/usr/bin/env python3
"""Kernel WireGuard against wireguard-go, both in one QEMU kernel guest: the ratios.

This machine's kernel has no WireGuard, so the kernel data plane is measured
in the guest of ``vnetd/lab/guest.py`` (Debian's kernel under QEMU/TCG, the
host's tree read-only under a tmpfs overlay, its own netns lab inside). TCG
runs Python about 20 times slower than the host, so absolute times in the
guest mean little; what this bench reports is each figure on a kernel device
over the same figure on wireguard-go **in the same guest boot**, measured in
alternation (the side that goes first alternates by round). The absolute
guest times are kept and printed too.

1. **One change at 1023 peers** (``bench/dataplane.py``'s figure): a lab of
   two pods; rank 1 (wireguard-go) runs, ranks 2..1023 are registered in
   etcd (valid records, endpoints nobody answers), and rank 0 starts after
   them with ``--dataplane kernel`` or ``--dataplane userspace``, so its
   device holds 1023 peers. ``--changes`` times one registered endpoint is
   moved and the daemon's own ``plan applied: 1 change(s) in X ms`` times its
   whole reconcile pass. Then rank 0 is stopped (SIGTERM: a kernel link goes
   with it) and started again with the other data plane. Dataplane's
   ``seed_members``, ``start_full`` and ``move_passes`` do the work.
2. **Join propagation at 8 ranks** (``bench/formation.py``'s steady joins):
   a lab of eight pods, all eight ranks on one data plane, rank 0 started
   last; once every daemon holds the other seven, ``--joins`` times a member
   joins (``register.py join`` at real-time priority) and each daemon gives a
   sample, its ``peer joined`` line minus etcd's acknowledgement. Then all
   eight stop and start again on the other data plane. Formation's
   ``steady_join`` does the work.

The host boots ONE guest for both parts and runs this script in it with
``--inside``; the script writes its figures to the guest's writable share
(``VNETD_GUEST_SHARE``, a host temp dir that ``run_in_guest`` reads back),
and the host writes ``bench/results/kernel_guest.json`` with the host's load
during the run (other work on the host's two cores slows the guest's). Every
wait in the guest is a hang guard well above what it guards; the guest's
boot, run and power-off are bounded by ``run_in_guest``, which kills QEMU by
its pid. Traffic stays in the guest (it has no network device).

Where no guest can boot (no QEMU, no kernel unpacked: ``scripts/setup``),
the script prints one line saying why and exits 0 without a result.

Run alone: ``.venv/bin/python bench/kernel_guest.py --rounds 1 --changes 3 --joins 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from common import (
    JSON,
    RESULTS,
    JsonMesh,
    attempt,
    fmt_s,
    latency,
    spread,
    wait_for,
    write_result,
)
from dataplane import SIZE, move_passes, seed_members, start_full
from formation import HOLD, SETTLE, idle_cpu, logs_full, steady_join
from guest_bench import run_script_in_guest, with_lab_retries

from vnetd.lab.cluster import write_spec
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.spec import load_spec

NAME = "kernel_guest"
TITLE = "Kernel WireGuard vs wireguard-go in the kernel guest"
DATAPLANES = ("kernel", "userspace")
OUTPUT = "kernel_guest.json"
SCRIPT = Path(__file__).resolve()
JOIN_RANKS = 8
LEASE_TTL = 30
"""The daemons' lease in the guest: a pass over 1023 peers under TCG can hold a
daemon's event loop for seconds, and an expired claim would restart the run."""
JOIN_WAIT = 120.0
"""Hang guard: every daemon in the guest adding (then dropping) the joining member."""
JOIN_TTL = 180
"""The joining member's lease, above ``JOIN_WAIT`` and the hold: under register.py's
10 s it expired while the guest's daemons were still adding it, and the revoke
found no lease (both join parts of the second run failed so)."""
FULL_TIMEOUT = 900.0
"""Hang guard: rank 0 reaching 1023 peers (about 2 minutes in the guest here)."""
MOVE_TIMEOUT = 180.0
"""Hang guard: one endpoint move reaching rank 0's log (seconds in the guest)."""
MESH_TIMEOUT = 600.0
"""Hang guard: eight daemons started and holding each other (minutes in the guest)."""
STOP_TIMEOUT = 60.0
"""A daemon's SIGTERM before SIGKILL: it removes a kernel link with 1023 peers."""
GUEST_TIMEOUT = 3600.0
BOOT_TIMEOUT = 400.0
"""The guest's boot: about 15 s on a quiet host, over 120 s at a load of 100."""


def order(round_: int) -> tuple[str, ...]:
    """The data planes of round ``round_``, the first alternating."""
    return DATAPLANES if round_ % 2 == 0 else DATAPLANES[::-1]


async def stop_rank(mesh: JsonMesh, rank: int) -> bool:
    """SIGTERM ``rank``'s daemon; whether its pod still had a ``vnet0`` (then removed, so
    the next start on the other data plane begins from no link)."""
    await mesh.daemons[rank].stop(timeout=STOP_TIMEOUT)
    pod = mesh.pod(rank)
    left = (await mesh.lab.run(pod, ["ip", "link", "show", "vnet0"], 30)).returncode == 0
    if left:
        await mesh.lab.run(pod, ["ip", "link", "del", "vnet0"], 30)
    return left


def print_troubles(mesh: JsonMesh, ranks: list[int], lines: int = 6) -> str:
    """Print the last warnings and errors of these ranks' daemons (the guest's lab is
    gone when the run ends: this is what a failed run leaves to read); the most
    frequent of them, counted, for the failure's record."""
    most = []
    for rank in ranks:
        if rank not in mesh.daemons:
            continue
        bad = [line for line in mesh.log(rank) if line.level not in ("INFO", "DEBUG")]
        kinds = Counter(line.message[:120] for line in bad)
        for line in bad[-lines:]:
            print(f"  rank {rank} {line.level}: {line.message[:300]}", flush=True)
        for kind, count in kinds.most_common(4):
            print(f"  rank {rank}: {count} line(s) {kind}...", flush=True)
        most += [f"rank {rank}: {n} x '{kind}...'" for kind, n in kinds.most_common(1)]
    return "; ".join(most) or "no warnings"


# --- 1: one change at 1023 peers ---------------------------------------------------------


async def change_part(rounds: int, changes: int, failures: list[JSON]) -> list[JSON]:
    runs: list[JSON] = []
    async with open_lab(2) as lab:
        path = write_spec(lab.workdir / "mesh.toml", SIZE, lab.etcd_url, ttl=LEASE_TTL)
        mesh = JsonMesh(lab, path, load_spec(path))
        mesh.log_level = "DEBUG"  # rank 0's passes in detail (``pass_details``)
        await mesh.start_rank(1, "--dataplane", "userspace")
        await wait_for(lambda: "claimed rank 1" in mesh.daemons[1].log_text(), "rank 1 claimed",
                       MESH_TIMEOUT, 0.5)  # fmt: skip
        await seed_members(lab, mesh)
        moved = 0
        for round_ in range(rounds):
            for dataplane in order(round_):
                what = {"part": "change", "round": round_, "dataplane": dataplane}
                print(f"one change at 1023 peers: round {round_ + 1}, {dataplane}", flush=True)
                run = await attempt(failures, what,
                                    lambda d=dataplane, m=moved: change_run(lab, mesh, d, m,
                                                                            changes))  # fmt: skip
                moved += changes
                if run is not None:
                    runs.append({**what, **run})
    return runs


async def change_run(lab: Lab, mesh: JsonMesh, dataplane: str, first: int, changes: int) -> JSON:
    started = time.monotonic()
    try:
        await start_full(mesh, "--dataplane", dataplane, timeout=FULL_TIMEOUT)
        full_s = time.monotonic() - started
        moves_from = time.time()
        passes = await move_passes(lab, mesh, changes, first, timeout=MOVE_TIMEOUT)
        details = pass_details(mesh, moves_from)
    except Exception as error:
        logged = print_troubles(mesh, [0])
        raise RuntimeError(f"{type(error).__name__}: {error}; logged {logged}") from error
    finally:
        link_left = await stop_rank(mesh, 0)
    print(f"  {dataplane}: 1023 peers {full_s:.1f} s after the start; one change: passes "
          f"{', '.join(f'{p:.1f}' for p in passes)} ms", flush=True)  # fmt: skip
    for line in details:
        print(f"    {line}", flush=True)
    return {"pass_ms": passes, "full_s": round(full_s, 3), "link_left": link_left,
            "details": details}  # fmt: skip


DETAILS = ("full pass: ", "vnet0: applied ", "plan applied: ")


def pass_details(mesh: JsonMesh, after: float, most: int = 40) -> list[str]:
    """Rank 0's lines of its passes since ``after`` (``DEBUG``: a full pass's device
    read, the data plane's own apply time), to tell a pass that read the whole device
    from one that wrote one peer."""
    lines = [line for line in mesh.log(0) if line.t >= after]
    picked = [f"+{line.t - after:.1f} s {line.message[:160]}" for line in lines
              if line.message.startswith(DETAILS)
              or " endpoint moved " in line.message]  # fmt: skip
    return picked[:most]


# --- 2: join propagation at 8 ranks ------------------------------------------------------


async def join_part(rounds: int, joins: int, failures: list[JSON]) -> list[JSON]:
    runs: list[JSON] = []
    async with open_lab(JOIN_RANKS) as lab:
        path = write_spec(lab.workdir / "mesh.toml", JOIN_RANKS + joins, lab.etcd_url,
                          ttl=LEASE_TTL)  # fmt: skip
        mesh = JsonMesh(lab, path, load_spec(path))
        for round_ in range(rounds):
            for dataplane in order(round_):
                what = {"part": "join", "round": round_, "dataplane": dataplane}
                print(f"join propagation at {JOIN_RANKS} ranks: round {round_ + 1}, {dataplane}",
                      flush=True)  # fmt: skip
                run = await attempt(failures, what,
                                    lambda d=dataplane: join_run(mesh, d, joins))  # fmt: skip
                if run is not None:
                    runs.append({**what, **run})
    return runs


async def join_run(mesh: JsonMesh, dataplane: str, joins: int) -> JSON:
    ranks = list(range(JOIN_RANKS))
    started = time.monotonic()
    try:
        for rank in [*ranks[1:], 0]:
            await mesh.start_rank(rank, "--dataplane", dataplane)
        await wait_for(lambda: logs_full(mesh, JOIN_RANKS), f"{JOIN_RANKS} ranks full mesh",
                       MESH_TIMEOUT, 0.5)  # fmt: skip
        full_s = time.monotonic() - started
        await trio.sleep(SETTLE)
        idle = await idle_cpu(mesh, JOIN_RANKS, HOLD)
        steady = [
            await steady_join(mesh, JOIN_RANKS, JOIN_RANKS + i, idle, JOIN_TTL, JOIN_WAIT)
            for i in range(joins)
        ]
    except Exception as error:
        logged = print_troubles(mesh, ranks, 3)
        raise RuntimeError(f"{type(error).__name__}: {error}; logged {logged}") from error
    finally:
        links_left = [rank for rank in mesh.daemons if await stop_rank(mesh, rank)]
    samples = [s for j in steady for s in j["samples_ms"]]
    print(f"  {dataplane}: mesh of {JOIN_RANKS} in {full_s:.1f} s; join propagation p50 "
          f"{latency(samples)['p50']:.1f} ms, max {max(samples):.1f} ms", flush=True)  # fmt: skip
    return {"steady": steady, "full_s": round(full_s, 3), "links_left": links_left}


# --- inside the guest --------------------------------------------------------------------


async def whole_part(
    name: str, part: Callable[[], Awaitable[list[JSON]]], failures: list[JSON]
) -> list[JSON]:
    """The runs of ``part``; when it fails as a whole (its lab, its first daemon) that is
    one failure and the other part still runs."""

    async def runs() -> JSON:
        return {"runs": await with_lab_retries(part)}

    done = await attempt(failures, {"part": name}, runs)
    return [] if done is None else list(done["runs"])


async def inside(args: Any) -> int:  # noqa: ANN401 - argparse's namespace
    share = Path(os.environ["VNETD_GUEST_SHARE"])
    failures: list[JSON] = []
    changes = await whole_part("change", lambda: change_part(args.rounds, args.changes,
                                                             failures), failures)  # fmt: skip
    joins = await whole_part("join", lambda: join_part(args.rounds, args.joins, failures),
                             failures)  # fmt: skip
    # The host's sampler is the run's load; one inside would count the guest's own labs
    # as foreign ones.
    record = {
        "runs": changes + joins,
        "failures": failures,
        "guest": {"kernel": platform.release(), "cpus": os.cpu_count(),
                  "loadavg": os.getloadavg()},
    }  # fmt: skip
    (share / OUTPUT).write_text(json.dumps(record, default=str) + "\n")
    return len(failures)


# --- on the host -------------------------------------------------------------------------


def ratio(kernel: float | None, userspace: float | None) -> float | None:
    return kernel / userspace if kernel is not None and userspace else None


def of(runs: list[JSON], part: str, dataplane: str) -> list[JSON]:
    return [r for r in runs if r["part"] == part and r["dataplane"] == dataplane]


def summarize(runs: list[JSON]) -> JSON:
    """Kernel and wireguard-go figures of each part, and kernel / wireguard-go."""
    pass_ms, full_s, lat, jpass = {}, {}, {}, {}
    for d in DATAPLANES:
        pass_ms[d] = spread(p for r in of(runs, "change", d) for p in r["pass_ms"])
        full_s[d] = spread(r["full_s"] for r in of(runs, "change", d))
        joins = [j for r in of(runs, "join", d) for j in r["steady"]]
        lat[d] = latency([s for j in joins for s in j["samples_ms"]])
        jpass[d] = latency([p for j in joins for p in j["pass_ms"]])
    return {
        "change": {
            "pass_ms": pass_ms,
            "ratio": ratio(pass_ms["kernel"]["median"], pass_ms["userspace"]["median"]),
            "round_ratios": spread(_round_ratios(runs)),
            "full_s": full_s,
            "peers": SIZE - 1,
        },
        "join": {
            "latency_ms": lat,
            "pass_ms": jpass,
            "ratio_p50": ratio(lat["kernel"]["p50"], lat["userspace"]["p50"]),
            "ratio_p90": ratio(lat["kernel"]["p90"], lat["userspace"]["p90"]),
            "pass_ratio_p50": ratio(jpass["kernel"]["p50"], jpass["userspace"]["p50"]),
            "ranks": JOIN_RANKS,
        },
        "links_left": sum(bool(r.get("link_left")) + len(r.get("links_left", [])) for r in runs),
    }


def _round_ratios(runs: list[JSON]) -> list[float]:
    """Per round of the change part: kernel's median pass over wireguard-go's."""
    out = []
    for round_ in sorted({r["round"] for r in runs if r["part"] == "change"}):
        med = {d: spread(p for r in of(runs, "change", d) if r["round"] == round_
                         for p in r["pass_ms"])["median"] for d in DATAPLANES}  # fmt: skip
        value = ratio(med["kernel"], med["userspace"])
        if value is not None:
            out.append(value)
    return out


async def on_host(args: Any) -> int:  # noqa: ANN401 - argparse's namespace
    options = ["--rounds", str(args.rounds), "--changes", str(args.changes),
               "--joins", str(args.joins)]  # fmt: skip
    record = await run_script_in_guest(SCRIPT, options, OUTPUT, run_timeout=args.guest_timeout,
                                       boot_timeout=BOOT_TIMEOUT)  # fmt: skip
    if isinstance(record, int):
        return record
    inner, guest = record.inner, record.guest
    params = {"rounds": args.rounds, "changes": args.changes, "joins": args.joins,
              "peers_for_change": SIZE - 1, "join_ranks": JOIN_RANKS, "lease_ttl_s": LEASE_TTL,
              "guest": guest}  # fmt: skip
    summary = summarize(inner["runs"])
    write_result(NAME, TITLE, params, inner["runs"], summary, record.load, args.out,
                 inner["failures"])  # fmt: skip
    change, join = summary["change"], summary["join"]
    print(
        f"kernel guest ({guest['kernel']}, boot {guest['boot_s']} s, wall {guest['wall_s']} s): "
        f"one change at 1023 peers kernel {fmt_s(change['pass_ms']['kernel']['median'], 1)} ms vs "
        f"wireguard-go {fmt_s(change['pass_ms']['userspace']['median'], 1)} ms "
        f"(ratio {fmt_s(change['ratio'])}); join propagation at {JOIN_RANKS} ranks p50 kernel "
        f"{fmt_s(join['latency_ms']['kernel']['p50'], 1)} ms vs wireguard-go "
        f"{fmt_s(join['latency_ms']['userspace']['p50'], 1)} ms (ratio {fmt_s(join['ratio_p50'])})",
        flush=True,
    )
    return 1 if inner["failures"] or record.returncode else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds, each measuring both data planes (1)")  # fmt: skip
    parser.add_argument("--changes", type=int, default=4, help="moves timed per device (4)")
    parser.add_argument("--joins", type=int, default=2, help="joins timed per mesh (2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--guest-timeout", type=float, default=GUEST_TIMEOUT,
                        help=f"bound on the run in the guest, s ({GUEST_TIMEOUT:g})")  # fmt: skip
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (network namespaces, the guest)")
    sys.exit(1 if trio.run(inside if args.inside else on_host, args) else 0)


if __name__ == "__main__":
    main()
