#!/usr/bin/env python3
"""One daemon taking a storm of joins: its CPU per join, with real etcd.

A lab of one pod and etcd. The pod runs ``bench/sim_ranks.py`` with one
daemon, rank 0 of a ``--size`` mesh (a whole ``run_daemon`` with the fake data
plane, as in ``control_plane.py``); once it has claimed, ``bench/register.py
storm`` writes the other ``--size`` - 1 ranks' records straight into etcd,
signed as their claims would be (``--unsigned``: not), ``--per-txn`` per transaction at ``--rate``
records per second. The figure is the daemon's CPU from its claim until its
device holds every peer (``cpu_s``; ``us_per_join``: over the joins), read by
the daemon's process itself when it saw each (``getrusage``). It is split by
measurement into three parts:

* ``proofs_cpu_s``: checking the records' signatures (each check timed in the
  daemon's process, ``sim_ranks.SharedProofs`` with nothing shared);
* ``rest_share_s``: an estimate of what the daemon spends whether or not
  anyone joins (its keepalives, quiet checks, timers), over as long as the
  storm lasted: its CPU a second over ``--rest`` s after it is full
  (``rest_cpu_per_s``, every peer held; a window catches one keepalive in 20 s
  at TTL 60), times the seconds from its claim to full;
* ``join_path_cpu_s``: the rest, the joins' own work (the watch and its
  resumes, decoding, the view, the reconciler's passes, the fake device);
  ``join_path_us``: over the joins. Of it ``device_cpu_s`` is the fake
  device's ``apply``, timed in the daemon's process (where a real daemon
  writes to wireguard-go or the kernel instead), and the daemon counts the
  member watch streams it opened (``watch_opens``: each batch of a storm is a
  resume) and its reconciler passes (``passes``) meanwhile. The summary gives
  each part's median over the runs, so the medians need not add up.

With ``--rank-ca`` the mesh pins a rank CA (``[mesh] rank_ca``; the bench makes one
in the lab's directory): the daemon claims with a certificate from it, every
stormed record carries one for its own signing key, and the daemon checks each
first claim's certificate and proof (docs/architecture.md, "Rank certificates").
The result is then ``join_storm_rank_ca``, with ``certs_cpu_s``: the certificates'
first checks, timed in the daemon as the signatures are (``certs_verified``: how
many), so ``proofs_cpu_s + certs_cpu_s`` is what vouching costs it.

Much lighter than
the 1024-rank simulation, so a change to the per-join path can be measured
before and after on a shared machine; ``--profile DIR`` leaves the daemon's
cProfile in ``DIR/sim-<pid>.prof`` (the whole ``trio.run``: its start too).

    .venv/bin/python bench/join_storm.py [--size 1024] [--rate 25] [--per-txn 1] [--rest 30]
        [--runs 1] [--rank-ca]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    base_parser,
    check_host,
    events,
    lab_netns,
    run_repeated,
    runs_for,
    spread,
    wait_for,
    write_result,
)

from vnetd.config import DEFAULT_RESYNC_INTERVAL
from vnetd.control.proof import create_signer_file
from vnetd.lab.cluster import write_spec
from vnetd.lab.open_lab import LabProcess, open_lab

NAME = "join_storm"
NAME_RANK_CA = "join_storm_rank_ca"
TITLE = "One daemon taking a storm of joins"
BOUND = 30.0
"""Seconds the daemon may take to claim, and to hold every peer after the last write."""


def first(process: LabProcess, kind: str) -> JSON | None:
    return next((e for e in events(process) if e.get("event") == kind), None)


async def one_run(args: Any, run: int) -> JSON:  # noqa: ANN401
    size = args.size
    async with open_lab(1) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            spec = write_spec(lab.workdir / "mesh.toml", size, lab.etcd_url, ttl=60)
            ca = pin_rank_ca(spec, lab.workdir / "rank-ca.key") if args.rank_ca else []
            pod = lab.pods[0]
            env = {"BENCH_PROFILE": str(args.profile)} if args.profile else {}
            # One daemon: it checks every record's signature itself, as in production.
            argv = [sys.executable, str(BENCH / "sim_ranks.py"), "--config", str(spec),
                    "--ranks", "0", "--state-root", str(pod.state_dir), "--own-proofs",
                    "--resync", str(args.resync), *ca]  # fmt: skip
            daemon = await lab.start(pod, argv, env, private_mount=False)
            await wait_for(lambda: first(daemon, "claimed"), "the daemon's claim", BOUND, 0.05)
            writer_argv = [
                sys.executable, str(BENCH / "register.py"), "storm", "--etcd", lab.etcd_url,
                "--spec", str(spec), "--ranks", f"1-{size - 1}", "--rate", str(args.rate),
                "--per-txn", str(args.per_txn), *(["--unsigned"] if args.unsigned else []), *ca,
            ]  # fmt: skip
            writer = await lab.start(pod, writer_argv, private_mount=False)
            written_within = (size - 1) / args.rate + BOUND
            await wait_for(lambda: first(writer, "storm") or writer.returncode not in (None, 0),
                           "the writes", written_within, 0.2)  # fmt: skip
            if first(writer, "storm") is None:
                raise RuntimeError(f"register.py storm failed:\n{writer.log_text()[-2000:]}")
            await wait_for(lambda: first(daemon, "full"), "every peer on the device", BOUND, 0.1)
            await trio.sleep(args.rest + 1.5)  # the progress lines of a whole rest window
            claimed, full = first(daemon, "claimed"), first(daemon, "full")
            wrote = first(writer, "storm")
            rest = rest_window(daemon, full, args.rest)
            await daemon.stop()
            nursery.cancel_scope.cancel()
    assert claimed is not None
    assert full is not None
    assert wrote is not None
    cpu = full["cpu"] - claimed["cpu"]
    proofs = full["proofs_cpu"] - claimed["proofs_cpu"]
    certs = full.get("certs_cpu", 0.0) - claimed.get("certs_cpu", 0.0)
    rest_rate = (rest[1]["cpu"] - rest[0]["cpu"]) / (rest[1]["t"] - rest[0]["t"])
    rest_share = rest_rate * (full["t"] - claimed["t"])
    join_path = cpu - proofs - certs - rest_share
    device = full["device_cpu"] - claimed["device_cpu"]
    result = {
        "run": run,
        "size": size,
        "joins": size - 1,
        "cpu_s": round(cpu, 4),
        "us_per_join": round(cpu / (size - 1) * 1e6, 1),
        "proofs_cpu_s": round(proofs, 4),
        "certs_cpu_s": round(certs, 4),
        "certs_verified": full.get("certs_verified", 0) - claimed.get("certs_verified", 0),
        "rest_cpu_per_s": round(rest_rate, 5),
        "claim_to_full_s": round(full["t"] - claimed["t"], 2),
        "rest_share_s": round(rest_share, 4),
        "join_path_cpu_s": round(join_path, 4),
        "join_path_us": round(join_path / (size - 1) * 1e6, 1),
        "device_cpu_s": round(device, 4),
        "watch_opens": full["watch_opens"] - claimed["watch_opens"],
        "passes": full["passes"] - claimed["passes"],
        "writes_s": round(wrote["t_ack"] - wrote["t_send"], 2),
        "full_after_last_write_s": round(full["t"] - wrote["t_ack"], 3),
        "load": sampler.summary(),
    }
    print(f"  run {run + 1}: {size - 1} joins in {result['writes_s']} s: daemon CPU "
          f"{cpu:.3f} s ({result['us_per_join']} µs a join), full "
          f"{result['full_after_last_write_s']} s after the last write; of it signatures "
          f"{proofs:.3f} s, certificates {certs:.3f} s ({result['certs_verified']}), "
          f"at rest {rest_share:.3f} s ({rest_rate * 1000:.1f} ms/s over "
          f"{result['claim_to_full_s']} s), the joins' own path {join_path:.3f} s "
          f"({result['join_path_us']} µs a join; the fake device {device:.3f} s, "
          f"{result['watch_opens']} watch opens, {result['passes']} passes)",
          flush=True)  # fmt: skip
    return result


def at_least_2(text: str) -> float:
    """``--rest``: the window needs two progress lines (one a second)."""
    value = float(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"--rest {text}: at least 2 s")
    return value


def pin_rank_ca(spec: Path, key: Path) -> list[str]:
    """Make a rank CA's key in ``key``, pin it in ``spec``'s ``[mesh]``; the options
    that give sim_ranks.py and register.py storm its certificates."""
    public = create_signer_file(key, "bench").public_key
    text = spec.read_text()
    spec.write_text(text.replace("[mesh]\n", f'[mesh]\nrank_ca = ["{public}"]\n', 1))
    return ["--rank-ca-key", str(key)]


def rest_window(daemon: LabProcess, full: JSON, seconds: float) -> tuple[JSON, JSON]:
    """The daemon's first and last progress lines of the ``seconds`` after it was full."""
    after = [e for e in events(daemon) if e.get("event") == "progress" and e["t"] > full["t"]]
    within = [e for e in after if e["t"] <= after[0]["t"] + seconds] if after else []
    if len(within) < 2:
        raise RuntimeError(f"fewer than 2 progress lines in the {seconds:.0f} s after full")
    return within[0], within[-1]


async def main_async(args: Any) -> int:  # noqa: ANN401
    n = runs_for(args.runs)
    runs, failures = await run_repeated(NAME, n, lambda i: one_run(args, i))
    params = {"size": args.size, "rate": args.rate, "per_txn": args.per_txn, "runs": n,
              "signed": not args.unsigned, "rank_ca": args.rank_ca, "rest_s": args.rest,
              "resync_s": args.resync}  # fmt: skip
    summary = {key: spread(r[key] for r in runs) for key in (
        "cpu_s", "us_per_join", "proofs_cpu_s", "certs_cpu_s", "certs_verified",
        "rest_cpu_per_s", "rest_share_s", "join_path_cpu_s", "join_path_us", "device_cpu_s",
        "watch_opens", "passes")}  # fmt: skip
    load = {"runs": [r["load"] for r in runs]}
    name, title = (NAME_RANK_CA, f"{TITLE}, rank certificates") if args.rank_ca else (NAME, TITLE)
    write_result(name, title, params, runs, summary, load, args.out, failures)
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(1024,), runs=1)
    parser.add_argument("--size", type=int, default=1024, help="the mesh (joins: size - 1)")
    parser.add_argument("--rate", type=float, default=25.0, help="records written per second")
    parser.add_argument("--per-txn", type=int, default=1, help="records per etcd transaction")
    parser.add_argument("--profile", type=Path, help="leave the daemon's cProfile here")
    parser.add_argument("--rest", type=at_least_2, default=30.0,
                        help="seconds its CPU at rest is read over, once full")  # fmt: skip
    parser.add_argument("--resync", type=float, default=DEFAULT_RESYNC_INTERVAL,
                        help="the daemon's --resync-interval, s (default "
                        f"{DEFAULT_RESYNC_INTERVAL:g}, the daemon's): what its full passes add "
                        "to the rest figure")  # fmt: skip
    parser.add_argument("--unsigned", action="store_true",
                        help="unsigned records (as older versions wrote): the share of the "
                        "signatures' verification")  # fmt: skip
    parser.add_argument("--rank-ca", action="store_true",
                        help="a mesh that pins a rank CA: every record carries a rank "
                        "certificate (result: join_storm_rank_ca)")  # fmt: skip
    args = parser.parse_args()
    if args.rank_ca and args.unsigned:
        parser.error("--rank-ca takes signed records only: drop --unsigned")
    check_host(("ip", "unshare", "nsenter", "etcd"))
    started = time.monotonic()
    failed = trio.run(main_async, args)
    print(f"{NAME}: {time.monotonic() - started:.0f} s", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
