#!/usr/bin/env python3
"""N member watches on one etcd, held open; run inside a lab pod by bench/etcd_faults.py.

    watch_load.py --url http://198.18.0.10:2379 --watchers 256 --mode checked --duration 90

``plain``: watch streams as before issue 18 (no header); ``leader``: the same,
leader-required (``Grpc-Metadata-Hasleader: true``); ``checked``: each an
``EtcdRegistry`` watch, as a daemon keeps it (leader-required, and a
linearizable read on its member whenever it has been quiet for
``QUIET_CHECK`` s); ``serializable``: leader-required streams, each with a
*serializable* leader-required read every ``QUIET_CHECK`` s instead (the
cheaper check weighed against the linearizable one). ``--members M`` first
puts M keys under the prefix (what a mesh of M holds, which ``EtcdRegistry``
counts to space its quiet checks). Prints ``ready`` once every watch is
confirmed.
"""

from __future__ import annotations

import argparse
import base64
import json

import httpx
import trio

from vnetd.errors import RegistryUnavailable
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import REQUIRE_LEADER
from vnetd.registry.etcd.watch import QUIET_CHECK

PREFIX = "/vnetd/bench/members/"
OPEN_ATTEMPTS = 10


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def raw_watch(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    ready: trio.MemorySendChannel[None],
) -> None:
    body = {"create_request": {"key": b64(PREFIX), "range_end": b64("/vnetd/bench/members0")}}
    async with client.stream("POST", f"{url}/v3/watch", json=body, headers=headers) as response:
        lines = response.aiter_lines()
        first = json.loads(await anext(lines))
        assert first["result"].get("created"), first
        await ready.send(None)
        async for _ in lines:
            pass


async def serializable_reads(client: httpx.AsyncClient, url: str) -> None:
    body = {"key": b64(PREFIX), "count_only": True, "serializable": True}
    while True:
        await trio.sleep(QUIET_CHECK)
        await client.post(f"{url}/v3/kv/range", json=body, headers=REQUIRE_LEADER)


async def registry_watch(url: str, ready: trio.MemorySendChannel[None]) -> None:
    """One daemon's watch; an open that a loaded machine let time out is tried again
    (up to ``OPEN_ATTEMPTS`` times in a row); ``ready`` is told once. A watch that
    fails once open (its quiet check found no answer on a loaded host: no member
    kept the stream) is opened again a second later, as a daemon's watcher lists
    and watches again, and says so on a ``reopened:`` line, which the bench counts:
    the window keeps its N watches and reports what kept them."""
    registry = EtcdRegistry([url], lease_ttl=10)
    told = False
    failed_opens = 0
    try:
        while True:
            opened = False
            try:
                async with registry.watch(PREFIX, 1) as events:
                    opened, failed_opens = True, 0
                    if not told:
                        told = True
                        await ready.send(None)
                    async for _ in events:
                        pass
                return
            except RegistryUnavailable as exc:
                if opened:
                    print(f"reopened: {exc}", flush=True)
                else:
                    failed_opens += 1
                    if failed_opens == OPEN_ATTEMPTS:
                        raise
                await trio.sleep(1.0)
    finally:
        await registry.aclose()


async def put_members(client: httpx.AsyncClient, url: str, members: int) -> None:
    for rank in range(members):
        body = {"key": b64(f"{PREFIX}{rank}"), "value": b64("{}")}
        (await client.post(f"{url}/v3/kv/put", json=body)).raise_for_status()


async def main(args: argparse.Namespace) -> None:
    send, receive = trio.open_memory_channel[None](args.watchers)
    limits = httpx.Limits(max_connections=args.watchers + 10)
    timeout = httpx.Timeout(10, read=None)
    ready = False
    with trio.move_on_after(args.duration):
        async with (
            httpx.AsyncClient(limits=limits, timeout=timeout) as client,
            trio.open_nursery() as nursery,
        ):
            await put_members(client, args.url, args.members)
            for _ in range(args.watchers):
                if args.mode == "checked":
                    nursery.start_soon(registry_watch, args.url, send)
                else:
                    headers = REQUIRE_LEADER if args.mode != "plain" else {}
                    nursery.start_soon(raw_watch, client, args.url, headers, send)
                if args.mode == "serializable":
                    nursery.start_soon(serializable_reads, client, args.url)
                await trio.sleep(args.stagger)
            for _ in range(args.watchers):
                await receive.receive()
            print("ready", flush=True)
            ready = True
    if not ready:
        print(f"gave up: the watches were not all open after {args.duration:g} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--watchers", type=int, required=True)
    parser.add_argument(
        "--mode", choices=("plain", "leader", "checked", "serializable"), required=True
    )
    parser.add_argument("--duration", type=float, default=90.0)
    parser.add_argument("--stagger", type=float, default=0.05, help="s between watch opens")
    parser.add_argument("--members", type=int, default=0, help="keys put under the prefix")
    trio.run(main, parser.parse_args())
