#!/usr/bin/env python3
"""Member watches over etcd's JSON gateway or native gRPC, and the writer that feeds
them; run inside a lab pod by bench/etcd_transport.py.

    etcd_transport_client.py watch --url URL --transport json|grpc|grpc-trio --prefix P
                                   --watchers W --count N --go FILE
    etcd_transport_client.py write --url URL --prefix P --count N --rate R

``watch`` connects ``W`` clients (one connection each, as W daemons have) and
prints ``connected``; once ``FILE`` exists it opens one watch per client on
``P`` from the revision written in it, prints ``ready`` when every watch is
confirmed, and exits with one JSON line when every watcher holds ``N`` events.
``json`` watches through vnetd's own ``EtcdRegistry.watch`` (the daemon's
decode path); ``grpc`` through grpcio (``grpc.aio``, on asyncio) with stubs
generated now from ``bench/etcd_watch.proto``, each event decoded into the
same ``WatchEvent``; ``grpc-trio`` through grpcio's sync API under trio, as a
trio daemon could use it (a worker thread per watch, each message handed to
trio). Its own CPU (``time.process_time``, every thread) is taken at
the go, at ``ready`` and at the end.

``write`` puts ``N`` member records (``encode_member``, as a claim writes
them; one revision each) at ``R`` per second and prints the first and last
revision as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import trio

from vnetd.control.membership import encode_member
from vnetd.model import Member
from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import b64
from vnetd.registry.etcd.transport import prefix_end

PROTO = Path(__file__).resolve().parent / "etcd_watch.proto"
GO_POLL = 0.01


def member_record(rank: int) -> bytes:
    """A record the size of a real claim's (X25519 key, endpoint, instance, device id)."""
    key = base64.b64encode(rank.to_bytes(2, "big") * 16).decode()
    member = Member(rank, key, f"198.18.{rank // 250}.{rank % 250 + 1}:51820",
                    f"pod-{rank:04d}.cluster.example", time.time(), "0.1.0",
                    f"{rank:08x}-0000-4000-8000-000000000000")  # fmt: skip
    return encode_member(member)


def write(args: argparse.Namespace) -> None:
    revisions = []
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        for rank in range(args.count):
            if args.rate:
                time.sleep(max(0.0, started + rank / args.rate - time.monotonic()))
            body = {"key": b64(f"{args.prefix}{rank}"), "value": b64(member_record(rank))}
            response = client.post(f"{args.url}/v3/kv/put", json=body)
            response.raise_for_status()
            revisions.append(int(response.json()["header"]["revision"]))
    print(json.dumps({"first_revision": revisions[0], "last_revision": revisions[-1],
                      "seconds": time.monotonic() - started,
                      "record_bytes": len(member_record(args.count - 1))}))  # fmt: skip


def go_revision(path: Path) -> int:
    """Wait for the go file; the revision written in it."""
    while not path.exists():
        time.sleep(GO_POLL)
    return int(path.read_text())


class Tally:
    def __init__(self, watchers: int) -> None:
        self.events = [0] * watchers
        self.messages = 0
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = time.process_time()

    def result(self, transport: str) -> dict[str, Any]:
        m = self.marks
        return {"transport": transport, "messages": self.messages, "events": sum(self.events),
                "open_cpu_s": m["ready"] - m["go"], "delivery_cpu_s": m["done"] - m["ready"],
                "total_cpu_s": m["done"] - m["go"], "versions": versions()}  # fmt: skip


def versions() -> dict[str, str]:
    names = ("httpx", "trio", "grpcio", "protobuf", "grpcio-tools")
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except Exception:  # noqa: BLE001 - absent: not recorded
            continue
    return found


async def json_watch(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally(args.watchers)
    registries = [EtcdRegistry([args.url]) for _ in range(args.watchers)]
    for registry in registries:  # connect, as a daemon is before its watch
        await registry.get(args.prefix)
    print("connected", flush=True)
    start = await trio.to_thread.run_sync(go_revision, Path(args.go))
    tally.mark("go")
    opened = trio.Event()
    confirmed = 0

    async def one(index: int, registry: EtcdRegistry) -> None:
        nonlocal confirmed
        async with registry.watch(args.prefix, start) as batches:
            confirmed += 1
            if confirmed == args.watchers:
                tally.mark("ready")
                print("ready", flush=True)
                opened.set()
            async for batch in batches:
                tally.messages += 1
                tally.events[index] += len(batch)
                if tally.events[index] >= args.count:
                    return

    async with trio.open_nursery() as nursery:
        for index, registry in enumerate(registries):
            nursery.start_soon(one, index, registry)
    tally.mark("done")
    for registry in registries:
        await registry.aclose()
    return tally.result("json")


def grpc_stubs() -> tuple[ModuleType, ModuleType]:
    """etcd_watch_pb2 and etcd_watch_pb2_grpc, generated now into a temporary dir."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="etcd-proto-") as out:
        argv = ["protoc", f"-I{PROTO.parent}", f"--python_out={out}",
                f"--grpc_python_out={out}", str(PROTO)]  # fmt: skip
        if protoc.main(argv) != 0:
            raise RuntimeError(f"protoc failed on {PROTO}")
        sys.path.insert(0, out)
        try:
            import etcd_watch_pb2  # type: ignore[import-not-found]
            import etcd_watch_pb2_grpc  # type: ignore[import-not-found]
        finally:
            sys.path.remove(out)
    return etcd_watch_pb2, etcd_watch_pb2_grpc


def watch_events(response: Any) -> list[WatchEvent]:  # noqa: ANN401 - a generated message
    """A gRPC WatchResponse's events, decoded as the JSON path decodes them."""
    return [WatchEvent(kind="delete" if event.type == 1 else "put",
                       key=event.kv.key.decode("utf-8", "surrogateescape"),
                       value=event.kv.value, mod_revision=event.kv.mod_revision,
                       create_revision=event.kv.create_revision)
            for event in response.events]  # fmt: skip


def create_request(pb: ModuleType, prefix: str, start: int) -> Any:  # noqa: ANN401
    request = pb.WatchCreateRequest(
        key=prefix.encode(), range_end=prefix_end(prefix), start_revision=start
    )
    return pb.WatchRequest(create_request=request)


async def grpc_trio_watch(args: argparse.Namespace) -> dict[str, Any]:
    """grpcio's sync API under trio: a worker thread per watch, each message handed
    to trio (``trio.from_thread``), as a trio daemon would have to use it."""
    import grpc

    pb, pb_grpc = grpc_stubs()
    tally = Tally(args.watchers)
    target = args.url.removeprefix("http://")
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(target, options=options) for _ in range(args.watchers)]
    for channel in channels:
        await trio.to_thread.run_sync(grpc.channel_ready_future(channel).result, 10)
    print("connected", flush=True)
    start = await trio.to_thread.run_sync(go_revision, Path(args.go))
    tally.mark("go")
    create = create_request(pb, args.prefix, start)
    finished = threading.Event()
    confirmed = 0

    def requests() -> Iterator[Any]:
        yield create
        finished.wait()  # keep the request side open until the end

    def deliver(index: int, response: Any) -> None:  # noqa: ANN401
        nonlocal confirmed
        if response.created:
            confirmed += 1
            if confirmed == args.watchers:
                tally.mark("ready")
                print("ready", flush=True)
            return
        batch = watch_events(response)
        if batch:
            tally.messages += 1
            tally.events[index] += len(batch)

    def drain(index: int, channel: Any) -> None:  # noqa: ANN401 - a grpc channel
        call = pb_grpc.WatchStub(channel).Watch(requests(), metadata=(("hasleader", "true"),))
        for response in call:
            trio.from_thread.run_sync(deliver, index, response)
            if tally.events[index] >= args.count:
                break
        call.cancel()

    limiter = trio.CapacityLimiter(args.watchers)
    async with trio.open_nursery() as nursery:
        for index, channel in enumerate(channels):
            nursery.start_soon(partial(trio.to_thread.run_sync, drain, index, channel,
                                       limiter=limiter))  # fmt: skip
    tally.mark("done")
    finished.set()
    for channel in channels:
        channel.close()
    return tally.result("grpc-trio")


async def open_grpc_watches(
    args: argparse.Namespace, mark: Callable[[str], None]
) -> tuple[list[Any], list[Any]]:
    """``args.watchers`` grpc.aio channels, one watch each on ``args.prefix`` from the go
    revision, every one confirmed: (channels, calls). ``mark`` takes "go" and "ready"."""
    import grpc

    pb, pb_grpc = grpc_stubs()
    target = args.url.removeprefix("http://")
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection per client
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(args.watchers)]
    for channel in channels:
        await channel.channel_ready()
    print("connected", flush=True)
    start = await asyncio.to_thread(go_revision, Path(args.go))
    mark("go")
    create = create_request(pb, args.prefix, start)
    calls = []
    for channel in channels:  # leader-required, as EtcdRegistry's watches are
        call = pb_grpc.WatchStub(channel).Watch(metadata=(("hasleader", "true"),))
        await call.write(create)
        calls.append(call)
    for call in calls:
        first = await call.read()
        assert first.created, first
    mark("ready")
    print("ready", flush=True)
    return channels, calls


async def close_grpc_watches(channels: list[Any], calls: list[Any]) -> None:
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


async def grpc_watch(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally(args.watchers)
    channels, calls = await open_grpc_watches(args, tally.mark)

    async def drain(index: int, call: Any) -> None:  # noqa: ANN401 - a generated stream
        while tally.events[index] < args.count:
            batch = watch_events(await call.read())
            if batch:
                tally.messages += 1
                tally.events[index] += len(batch)

    await asyncio.gather(*(drain(i, call) for i, call in enumerate(calls)))
    tally.mark("done")
    await close_grpc_watches(channels, calls)
    return tally.result("grpc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("watch", "write"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--transport", choices=("json", "grpc", "grpc-trio"), default="json")
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--go", default="")
    parser.add_argument("--rate", type=float, default=0.0, help="puts/s; 0: back to back")
    args = parser.parse_args()
    if args.action == "write":
        write(args)
    elif args.transport == "json":
        print(json.dumps(trio.run(json_watch, args)), flush=True)
    elif args.transport == "grpc-trio":
        print(json.dumps(trio.run(grpc_trio_watch, args)), flush=True)
    else:
        print(json.dumps(asyncio.run(grpc_watch(args))), flush=True)


if __name__ == "__main__":
    main()
