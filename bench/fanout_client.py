#!/usr/bin/env python3
"""The watchers and the registering ranks of bench/watch_fanout.py; run inside a lab pod.

    fanout_client.py watch --url URL --transport grpc|json|vnetd-grpc --prefix P
                           --watchers W --count N --go FILE [--watch-url URL] [--list]
    fanout_client.py register --url URL --prefix P --count N [--connections 32] [--claims]

``watch`` connects ``W`` clients (one connection each, as W daemons have) to
``URL`` (etcd, etcd's grpc-proxy, or a vnetd relay) and prints ``connected``;
with ``--list`` (JSON only) each client first lists ``P``, as a daemon
starting does, and the result's ``listed`` counts the members they got;
once ``FILE`` exists it opens one watch per client on ``P`` from the revision
written in it and prints ``ready`` when every watch is confirmed; it exits
with one JSON line when every watcher holds ``N`` events: the events and
messages received, its own CPU, and ``done`` (``time.monotonic()``, which
every process on the machine shares) when the last watcher had all ``N``.
``grpc`` watches through grpcio (``grpc.aio``) with the stubs and decode of
bench/etcd_transport_client.py; ``json`` through vnetd's own
``EtcdRegistry.watch``, the daemon's read path (etcd's JSON gateway, or a
relay serving its read subset); ``vnetd-grpc`` through the daemon's own gRPC watch
(``GrpcWatchRegistry``, ``[registry] watch = "grpc"``), its calls on ``URL`` and its
watch on ``--watch-url`` (etcd's grpc-proxy, say; default ``URL``).

``register`` puts ``N`` member records (``member_record``: a claim's size), one
revision each, as N ranks starting at once would: ``--connections`` requests
in flight at a time over the JSON gateway, as fast as etcd answers. It prints
one JSON line with ``first`` (monotonic, just before the first request) and
``last`` (the last answer in) and the revisions. With ``--claims`` each rank
claims as a daemon does instead of putting: a lease grant, then the create
transaction under that lease (vnetd's own request builders), two requests a rank.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from etcd_transport_client import (
    close_grpc_watches,
    go_revision,
    member_record,
    open_grpc_watches,
    watch_events,
)

from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import b64, create_call, grant_call
from vnetd.registry.etcd.grpc_watch import GrpcWatchRegistry

CLAIM_TTL = 120
"""The claims' lease TTL: longer than a run, so no claim lapses inside it."""
CLIENT_TIMEOUT = 600.0
"""A bound on one watch client's whole life (the bench stops it earlier)."""


class Tally:
    """What the watchers received, with CPU marks at the go, ``ready`` and the end."""

    def __init__(self, watchers: int, count: int) -> None:
        self.events = [0] * watchers
        self.count = count
        self.complete = 0
        self.messages = 0
        self.cpu: dict[str, float] = {}
        self.done = 0.0
        self.listed = 0

    def mark(self, name: str) -> None:
        self.cpu[name] = time.process_time()

    def take(self, index: int, events: int) -> bool:
        """Count a message of ``events`` for watcher ``index``; True once it holds all."""
        self.messages += 1
        before = self.events[index]
        self.events[index] += events
        if before < self.count <= self.events[index]:
            self.complete += 1
            if self.complete == len(self.events):
                self.done = time.monotonic()
        return self.events[index] >= self.count

    def result(self, transport: str) -> dict[str, Any]:
        c = self.cpu
        return {"transport": transport, "events": sum(self.events), "messages": self.messages,
                "open_cpu_s": c["ready"] - c["go"], "delivery_cpu_s": c["done"] - c["ready"],
                "done": self.done, "listed": self.listed}  # fmt: skip


def open_watcher(args: argparse.Namespace) -> EtcdRegistry:
    """One watcher's registry, as a daemon of the arm's transport opens it."""
    if args.transport == "vnetd-grpc":
        return GrpcWatchRegistry([args.url], watch_endpoints=[args.watch_url or args.url])
    return EtcdRegistry([args.url])


async def json_watch(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally(args.watchers, args.count)
    registries = [open_watcher(args) for _ in range(args.watchers)]
    for registry in registries:  # connected, as a daemon is before its watch
        if args.list:  # and holding the members, as a daemon is after its first list
            tally.listed += len((await registry.list_prefix(args.prefix))[0])
        else:
            await registry.get(args.prefix)
    print("connected", flush=True)
    start = await trio.to_thread.run_sync(go_revision, Path(args.go))
    tally.mark("go")
    confirmed = 0

    async def one(index: int, opened: EtcdRegistry) -> None:
        nonlocal confirmed
        async with opened.watch(args.prefix, start) as batches:
            confirmed += 1
            if confirmed == args.watchers:
                tally.mark("ready")
                print("ready", flush=True)
            async for batch in batches:
                if tally.take(index, len(batch)):
                    return

    with trio.fail_after(CLIENT_TIMEOUT):
        async with trio.open_nursery() as nursery:
            for index, opened in enumerate(registries):
                nursery.start_soon(one, index, opened)
    tally.mark("done")
    for opened in registries:
        await opened.aclose()
    return tally.result(args.transport)


async def grpc_watch(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally(args.watchers, args.count)
    channels, calls = await open_grpc_watches(args, tally.mark)

    async def drain(index: int, call: Any) -> None:  # noqa: ANN401 - a generated stream
        while True:
            batch = watch_events(await call.read())
            if batch and tally.take(index, len(batch)):
                return

    await asyncio.wait_for(
        asyncio.gather(*(drain(i, call) for i, call in enumerate(calls))), CLIENT_TIMEOUT
    )
    tally.mark("done")
    await close_grpc_watches(channels, calls)
    return tally.result("grpc")


async def register(args: argparse.Namespace) -> dict[str, Any]:
    """``--count`` records, ``--connections`` requests in flight, back to back."""
    bodies = [{"key": b64(f"{args.prefix}{rank}"), "value": b64(member_record(rank))}
              for rank in range(args.count)]  # fmt: skip
    revisions: list[int] = []
    limits = httpx.Limits(max_connections=args.connections)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        await client.post(f"{args.url}/v3/kv/range", json={"key": b64(args.prefix)})
        queue = iter(enumerate(bodies))

        async def put(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = await client.post(f"{args.url}{path}", json=body)
            response.raise_for_status()
            answer: dict[str, Any] = response.json()
            return answer

        async def worker() -> None:
            for rank, body in queue:
                if not args.claims:
                    answer = await put("/v3/kv/put", body)
                else:
                    lease = int((await put(*grant_call(CLAIM_TTL)))["ID"])
                    key = f"{args.prefix}{rank}"
                    answer = await put(*create_call(key, member_record(rank), lease))
                    if not answer.get("succeeded"):
                        raise RuntimeError(f"claim of {key} refused: {answer}")
                revisions.append(int(answer["header"]["revision"]))

        first = time.monotonic()
        with trio.fail_after(CLIENT_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for _ in range(args.connections):
                    nursery.start_soon(worker)
        last = time.monotonic()
    size = len(member_record(args.count - 1))
    return {"first": first, "last": last, "first_revision": min(revisions),
            "last_revision": max(revisions), "record_bytes": size}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("watch", "register"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--transport", choices=("json", "grpc", "vnetd-grpc"), default="grpc")
    parser.add_argument("--watch-url", default="", help="vnetd-grpc's watch endpoint")
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--go", default="")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--claims", action="store_true", help="register: grant + create each")
    parser.add_argument("--list", action="store_true", help="watch: each client lists P first")
    args = parser.parse_args()
    if args.action == "register":
        result = trio.run(register, args)
    elif args.transport in ("json", "vnetd-grpc"):
        result = trio.run(json_watch, args)
    else:
        result = asyncio.run(grpc_watch(args))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
