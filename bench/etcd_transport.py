#!/usr/bin/env python3
"""etcd transport: what a delivered member event costs etcd and the client, through the
JSON gateway and through native gRPC, one event per message and batched.

    etcd_transport.py [--sizes 64] [--puts 250] [--rate 50] [--runs 3] [--out DIR]

One lab (one pod, etcd 3.4 in its own namespace). Each case is one process in
the pod (bench/etcd_transport_client.py) holding W watchers (``--sizes``), one
connection each, on a fresh members prefix, and ``--puts`` member records
written by another process in the pod at ``--rate`` per second. Three
clients: the JSON gateway through ``EtcdRegistry.watch``; gRPC through
``grpc.aio``; gRPC through grpcio's sync API in trio worker threads, as a
trio daemon could use it. Two deliveries:

* ``live``: the watches are open and up to date before the puts, so etcd sends
  each watcher one message per revision;
* ``batched``: the puts land first and the watches then open from the first
  put's revision, so etcd sends many revisions per message (what a daemon's
  storm resume gets, docs/architecture.md "Join storms come in batches"); the
  client's figure includes opening the W watches (one resume per watcher).

Per case: etcd CPU (utime + stime from /proc) per delivered event (W × puts),
and the client's own CPU per event. In ``live`` the etcd figure has the puts'
own cost (a run of the same writes with no watcher, per run) taken off, and
the client figure is delivery only (opening the watches apart, per watch).
The summary's ``total_us_per_event`` is etcd + client. etcd's CPU comes in
clock ticks (10 ms): keep W × puts at 10,000 or more for figures to the µs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    base_parser,
    check_host,
    proc_cpu_seconds,
    run_repeated,
    spread,
    write_result,
)

from vnetd.lab.open_lab import Lab, open_lab
from vnetd.lab.pods import LabProcess

NAME = "etcd_transport"
TITLE = "etcd transport: JSON gateway against native gRPC, per delivered member event"
CLIENT = str(BENCH / "etcd_transport_client.py")
TRANSPORTS = ("json", "grpc", "grpc-trio")
MODES = ("live", "batched")
CASE_TIMEOUT = 120.0


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], sizes=[64], runs=3)
    parser.add_argument("--puts", type=int, default=250, help="member records per case")
    parser.add_argument("--rate", type=float, default=50.0, help="puts/s (live must keep up)")
    return parser.parse_args()


async def wait_line(process: LabProcess, text: str, timeout: float) -> str:  # noqa: ASYNC109
    """The first line of ``process``'s log that starts with ``text``."""
    with trio.fail_after(timeout):
        while True:
            for line in process.log_text().splitlines():
                if line.startswith(text):
                    return line
            if process.returncode is not None:
                raise RuntimeError(f"{CLIENT} exited: {process.log_text()[-800:]}")
            await trio.sleep(0.02)


async def write(lab: Lab, prefix: str, args: argparse.Namespace) -> JSON:
    argv = [sys.executable, CLIENT, "write", "--url", lab.etcd_url, "--prefix", prefix,
            "--count", str(args.puts), "--rate", str(args.rate)]  # fmt: skip
    writer = await lab.start(lab.pods[0], argv, private_mount=False)
    result: JSON = json.loads(await wait_line(writer, "{", CASE_TIMEOUT))
    return result


def signal_go(path: Path, revision: int) -> None:
    """Tell the client to open its watches from ``revision`` (the file appears whole)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(revision))
    os.replace(tmp, path)


class Run:
    """One run: the puts' own etcd cost, then every transport × mode."""

    def __init__(self, lab: Lab, args: argparse.Namespace, watchers: int, index: int) -> None:
        self.lab, self.args, self.watchers, self.index = lab, args, watchers, index
        self.last_revision = 0
        self.put_cpu = 0.0

    @property
    def etcd_cpu(self) -> float:
        assert self.lab.etcd is not None
        return proc_cpu_seconds(self.lab.etcd.pid)

    async def baseline(self) -> None:
        before = self.etcd_cpu
        written = await write(self.lab, f"/vnetd/bench-{self.index}-puts/members/", self.args)
        self.put_cpu = self.etcd_cpu - before
        self.last_revision = written["last_revision"]

    async def case(self, transport: str, mode: str) -> JSON:
        prefix = f"/vnetd/bench-{self.index}-{transport}-{mode}/members/"
        go = self.lab.workdir / f"go-{self.index}-{transport}-{mode}"
        argv = [sys.executable, CLIENT, "watch", "--url", self.lab.etcd_url, "--prefix", prefix,
                "--transport", transport, "--watchers", str(self.watchers),
                "--count", str(self.args.puts), "--go", str(go)]  # fmt: skip
        client = await self.lab.start(self.lab.pods[0], argv, private_mount=False)
        try:
            await wait_line(client, "connected", CASE_TIMEOUT)
            await trio.sleep(0.5)
            if mode == "batched":
                written = await write(self.lab, prefix, self.args)
                before = self.etcd_cpu
                signal_go(go, written["first_revision"])
                result: JSON = json.loads(await wait_line(client, "{", CASE_TIMEOUT))
                etcd_cpu = self.etcd_cpu - before
            else:
                signal_go(go, self.last_revision + 1)
                await wait_line(client, "ready", CASE_TIMEOUT)
                await trio.sleep(0.5)
                before = self.etcd_cpu
                written = await write(self.lab, prefix, self.args)
                result = json.loads(await wait_line(client, "{", CASE_TIMEOUT))
                etcd_cpu = self.etcd_cpu - before - self.put_cpu
        finally:
            await client.stop()
        self.last_revision = written["last_revision"]
        events = self.watchers * self.args.puts
        client_cpu = result["delivery_cpu_s"] if mode == "live" else result["total_cpu_s"]
        figures = {
            "transport": transport,
            "mode": mode,
            "watchers": self.watchers,
            "puts": self.args.puts,
            "events": result["events"],
            "messages": result["messages"],
            "events_per_message": round(result["events"] / max(result["messages"], 1), 1),
            "etcd_cpu_s": round(etcd_cpu, 3),
            "put_cpu_s": round(self.put_cpu, 3) if mode == "live" else 0.0,
            "client_cpu_s": round(client_cpu, 3),
            "open_us_per_watch": round(result["open_cpu_s"] / self.watchers * 1e6, 1),
            "etcd_us_per_event": round(etcd_cpu / events * 1e6, 1),
            "client_us_per_event": round(client_cpu / events * 1e6, 1),
            "total_us_per_event": round((etcd_cpu + client_cpu) / events * 1e6, 1),
            "record_bytes": written["record_bytes"],
            "versions": result["versions"],
        }
        print(f"  {transport} {mode}: etcd {figures['etcd_us_per_event']} µs/event, client "
              f"{figures['client_us_per_event']} µs/event, "
              f"{figures['events_per_message']} events/message", flush=True)  # fmt: skip
        return figures


async def bench(args: argparse.Namespace) -> None:
    runs: list[JSON] = []
    failures: list[JSON] = []
    async with open_lab(1) as lab, trio.open_nursery() as nursery:
        sampler = LoadSampler(own_netns=set(lab.netns_names))
        nursery.start_soon(sampler.run)
        for watchers in args.sizes:

            async def one(index: int, watchers: int = watchers) -> JSON:
                run = Run(lab, args, watchers, index)
                await run.baseline()
                cases = [await run.case(t, m) for t in TRANSPORTS for m in MODES]
                return {"watchers": watchers, "run": index + 1, "put_cpu_s": run.put_cpu,
                        "cases": cases}  # fmt: skip

            started = time.monotonic()
            done, failed = await run_repeated(f"{watchers} watchers", args.runs.get(0, 1), one)
            print(f"  {len(done)} runs in {time.monotonic() - started:.0f} s", flush=True)
            runs += done
            failures += failed
        nursery.cancel_scope.cancel()
    summary = summarize(runs)
    decision = verdict(summary)
    print(f"total / JSON total: {decision['over_json_total']}", flush=True)
    params = {"watchers": args.sizes, "puts": args.puts, "rate": args.rate}
    write_result(NAME, TITLE, params, runs, {**summary, "decision": decision},
                 sampler.summary(), args.out, failures)  # fmt: skip


def summarize(runs: list[JSON]) -> JSON:
    """Per transport and mode: the spread of each per-event figure over the runs."""
    cases = [case for run in runs for case in run["cases"]]
    summary: JSON = {}
    for transport in TRANSPORTS:
        for mode in MODES:
            mine = [c for c in cases if c["transport"] == transport and c["mode"] == mode]
            if not mine:
                continue
            keys = ("etcd_us_per_event", "client_us_per_event", "total_us_per_event",
                    "events_per_message", "open_us_per_watch")  # fmt: skip
            summary[f"{transport}_{mode}"] = {key: spread(c[key] for c in mine) for key in keys}
            summary[f"{transport}_{mode}"]["versions"] = mine[-1]["versions"]
    return summary


def verdict(summary: JSON) -> JSON:
    """Does each gRPC client at least halve the JSON total per event (the rule for
    adopting gRPC), in each delivery mode?"""
    ratios: JSON = {}
    for transport in TRANSPORTS[1:]:
        for mode in MODES:
            json_case, other = summary.get(f"json_{mode}"), summary.get(f"{transport}_{mode}")
            if json_case and other:
                total = other["total_us_per_event"]["median"]
                ratio = total / json_case["total_us_per_event"]["median"]
                ratios.setdefault(transport, {})[mode] = round(ratio, 3)
    halves = {t: all(r <= 0.5 for r in by_mode.values()) for t, by_mode in ratios.items()}
    return {"over_json_total": ratios, "halves": halves}


def main() -> None:
    check_host(("ip", "unshare", "nsenter", "etcd"))
    trio.run(bench, parse_args())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
