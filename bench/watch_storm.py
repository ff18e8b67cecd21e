#!/usr/bin/env python3
"""A join storm against many member watches: what etcd and the watchers pay for it.

    watch_storm.py --watchers 64 --joins 256 [--rate 500] [--out FILE]

Starts a throwaway etcd on 127.0.0.1 (``vnetd.lab.etcd.run_etcd``), runs
``--watchers`` copies of ``vnetd.control.watcher.sync_members`` in this
process, each with its own ``EtcdRegistry`` (its own connection), waits until
all have listed, then writes ``--joins`` member records from a separate
process at ``--rate`` per second (0: as fast as it can) and waits until every
watcher's view holds them all. Reported (one JSON object on stdout):

* ``messages``: watch messages the watchers received that carried events
  (etcd sends an up-to-date watcher one per revision); ``opens``: watch
  streams opened (each is a request for etcd and the gateway);
* ``etcd_cpu_s`` (utime + stime of etcd from /proc, storm only), and per
  delivered event (watchers x joins) in µs; ``client_cpu_s``, this process;
* ``converge_s``: the last write acknowledged → every view complete.

No lab namespace is needed: etcd listens on loopback only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import vnetd.registry.etcd.client as etcd_client
import vnetd.registry.etcd.gateway as etcd_gateway
from vnetd.control.membership import encode_member, member_key
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.lab.etcd import run_etcd
from vnetd.model import Member
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.spec import MeshSpec, parse_spec

CLK_TCK = os.sysconf("SC_CLK_TCK")


def spec_for(joins: int) -> MeshSpec:
    return parse_spec({"mesh": {"name": "storm", "size": joins, "network": "10.64.0.0/12"}})


def proc_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Counts:
    messages = 0
    opens = 0


def count_messages(counts: Counts) -> None:
    """Wrap the etcd backend's message reader to count what the watchers receive: where
    the client reads a watch's confirmation, and where the codec reads its events."""
    original = etcd_gateway.next_message

    async def counted(lines: Any) -> Any:  # noqa: ANN401
        result = await original(lines)
        if result.get("created", False):
            counts.opens += 1
        elif result.get("events"):
            counts.messages += 1
        return result

    etcd_client.next_message = counted  # type: ignore[attr-defined]
    etcd_gateway.next_message = counted


async def write_joins(url: str, joins: int, rate: float) -> None:
    """The writer process: ``joins`` member records, paced at ``rate`` per second."""
    spec = spec_for(joins)
    registry = EtcdRegistry([url])
    start = trio.current_time()
    lease = await registry.grant(3600)  # readers skip an entry bound to no lease

    async def one(rank: int) -> None:
        if rate:
            await trio.sleep_until(start + rank / rate)
        key = base64.b64encode(rank.to_bytes(2, "big") * 16).decode()
        member = Member(rank, key, f"198.18.{rank // 250}.{rank % 250 + 1}:51820", f"pod{rank}")
        await registry.create(member_key(spec, rank), encode_member(member), lease)

    async with trio.open_nursery() as nursery:
        for rank in range(joins):
            if not rate:
                await one(rank)
            else:
                nursery.start_soon(one, rank)
    await registry.aclose()


async def storm(watchers: int, joins: int, rate: float) -> dict[str, Any]:
    spec = spec_for(joins)
    counts = Counts()
    count_messages(counts)
    with tempfile.TemporaryDirectory(prefix="watch-storm-") as tmp:
        async with run_etcd(Path(tmp) / "etcd") as server:
            registries = [EtcdRegistry([server.url]) for _ in range(watchers)]
            views = [MemberView() for _ in range(watchers)]
            async with trio.open_nursery() as nursery:
                for registry, view in zip(registries, views, strict=True):
                    nursery.start_soon(sync_members, registry, spec, view, RegistryHealth())
                while not all(view.synced for view in views):  # noqa: ASYNC110 - polls views
                    await trio.sleep(0.05)
                await trio.sleep(0.5)
                etcd_before, client_before = proc_cpu(server.pid), time.process_time()
                opens_before = counts.opens
                started = time.monotonic()
                await trio.run_process(
                    [sys.executable, __file__, "--write", server.url, "--joins", str(joins),
                     "--rate", str(rate)],
                )  # fmt: skip
                written = time.monotonic()
                while not all(len(view.members) == joins for view in views):  # noqa: ASYNC110
                    await trio.sleep(0.002)
                done = time.monotonic()
                etcd_cpu = proc_cpu(server.pid) - etcd_before
                client_cpu = time.process_time() - client_before
                nursery.cancel_scope.cancel()
            for registry in registries:
                await registry.aclose()
    events = watchers * joins
    return {
        "watchers": watchers,
        "joins": joins,
        "rate": rate,
        "messages": counts.messages,
        "opens": counts.opens - opens_before,
        "events": events,
        "events_per_message": round(events / max(counts.messages, 1), 1),
        "etcd_cpu_s": round(etcd_cpu, 3),
        "etcd_us_per_event": round(etcd_cpu / events * 1e6, 1),
        "client_cpu_s": round(client_cpu, 3),
        "client_us_per_event": round(client_cpu / events * 1e6, 1),
        "write_s": round(written - started, 3),
        "converge_s": round(done - written, 3),
        "passes_per_watcher": round(sum(view.version for view in views) / watchers, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=64)
    parser.add_argument("--joins", type=int, default=256)
    parser.add_argument("--rate", type=float, default=500.0, help="joins/s; 0: back to back")
    parser.add_argument("--storm-rate", type=float, help="override storm.STORM_RATE (events/s)")
    parser.add_argument("--pause", type=float, help="a fixed pause in a storm (s)")
    parser.add_argument("--write", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.storm_rate is not None or args.pause is not None:
        import vnetd.control.storm as gauge  # absent before batching: imported only here

        if args.storm_rate is not None:
            gauge.STORM_RATE = args.storm_rate
        if args.pause is not None:
            gauge.PAUSE_MIN = gauge.PAUSE_MAX = args.pause
    if args.write:
        trio.run(write_joins, args.write, args.joins, args.rate)
        return
    result = trio.run(storm, args.watchers, args.joins, args.rate)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
