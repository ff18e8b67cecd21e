#!/usr/bin/env python3
"""Cost of one peer change on a wireguard-go device with many peers: incremental vs full replace.

    uapi_cost.py --interface wgb0 --peers 1023 --repeats 10 --keep PUBKEY

Run beside a hand-made wireguard-go (in its mount namespace, to reach
``/run/wireguard/<if>.sock``). It fills the device up to ``--peers`` peers
(random keys, endpoints in 198.18.200.0/22 on which nothing listens, one
/32 each in 10.252.0.0/16), then times, ``--repeats`` times each:

- ``update``: one UAPI ``set`` moving one peer's endpoint (``update_only``),
  what vnetd sends when a member moves, on a new connection;
- ``update_kept``: the same on one connection kept open for every request (as
  the daemon's data plane does, ``UapiClient(keep_open=True)``); for both the
  client's own CPU is recorded too (``cpu_ms``: this process's CPU time);
- ``add_remove``: one ``set`` adding a peer, one removing it (a join, a leave);
- ``replace``: one ``set`` with ``replace_peers=true`` and every peer again
  (what ``wg setconf`` does), the full-replace alternative;
- ``get``: one full ``get`` (vnetd's reconciler reads the device before
  diffing, and again after applying to move routes).

It also reports whether the session with ``--keep`` (a peer with a live
handshake) survives an incremental update and a full replace: a replace
drops every peer's session, so every tunnel has to handshake again.
Prints one JSON line; times in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable

import trio
from register import random_public_key

from vnetd.dataplane.base import key_to_hex
from vnetd.dataplane.codec.uapi_protocol import parse_peers
from vnetd.dataplane.wireguard_go.uapi_client import UapiClient


def peer_lines(key: str, endpoint: str | None, ips: tuple[str, ...]) -> list[tuple[str, str]]:
    lines = [("public_key", key_to_hex(key))]
    if endpoint:
        lines.append(("endpoint", endpoint))
    lines.append(("replace_allowed_ips", "true"))
    lines += [("allowed_ip", ip) for ip in ips]
    return lines


def fake_endpoint(i: int) -> str:
    return f"198.18.{200 + i // 256}.{i % 256}:51999"


async def timed(action: Awaitable[object]) -> float:
    started = time.perf_counter()
    await action
    return (time.perf_counter() - started) * 1000


async def timed_cpu(action: Awaitable[object], cpu: list[float]) -> float:
    """``timed``, appending the CPU this process spent meanwhile (ms) to ``cpu``."""
    started = time.process_time()
    elapsed = await timed(action)
    cpu.append((time.process_time() - started) * 1000)
    return elapsed


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    uapi = UapiClient(f"/run/wireguard/{args.interface}.sock", timeout=30)
    existing = parse_peers(await uapi.get())
    lines: list[tuple[str, str]] = []
    for i in range(args.peers - len(existing)):
        ip = f"10.252.{i // 256}.{i % 256}/32"
        lines += peer_lines(random_public_key(), fake_endpoint(i), (ip,))
    await uapi.set(lines)
    device = parse_peers(await uapi.get())
    others = [k for k in device if k != args.keep]
    handshake = (device[args.keep].last_handshake or 0.0) if args.keep in device else 0.0
    times: dict[str, list[float]] = {
        "update": [], "update_kept": [], "add_remove": [], "replace": [], "get": []
    }  # fmt: skip
    cpu: dict[str, list[float]] = {"update": [], "update_kept": []}
    kept = UapiClient(uapi.path, timeout=30, keep_open=True)
    for n in range(args.repeats):
        key = others[n % len(others)]
        update = [("public_key", key_to_hex(key)), ("update_only", "true"),
                  ("endpoint", fake_endpoint(1000 + n))]  # fmt: skip
        times["update"].append(await timed_cpu(uapi.set(update), cpu["update"]))
        update[-1] = ("endpoint", fake_endpoint(1100 + n))
        times["update_kept"].append(await timed_cpu(kept.set(update), cpu["update_kept"]))
        extra = random_public_key()
        add = peer_lines(extra, fake_endpoint(1020), ("10.252.255.254/32",))
        remove = [("public_key", key_to_hex(extra)), ("remove", "true")]
        started = time.perf_counter()
        await uapi.set(add)
        await uapi.set(remove)
        times["add_remove"].append((time.perf_counter() - started) * 1000)
        times["get"].append(await timed(uapi.get()))
    kept.close()
    after_updates = parse_peers(await uapi.get())
    kept_after_update = bool(handshake) and after_updates[args.keep].last_handshake == handshake
    for _ in range(args.repeats):
        current = parse_peers(await uapi.get())
        full: list[tuple[str, str]] = [("replace_peers", "true")]
        for key, peer in current.items():
            full += peer_lines(key, peer.endpoint, peer.allowed_ips)
        times["replace"].append(await timed(uapi.set(full)))
    after_replace = parse_peers(await uapi.get())
    kept_after_replace = bool(handshake) and bool(after_replace[args.keep].last_handshake)
    return {
        "peers": len(device),
        "ms": {k: statistics.median(v) for k, v in times.items()},
        "all_ms": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "cpu_ms": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
        "had_session": bool(handshake),
        "session_kept_after_update": kept_after_update,
        "session_kept_after_replace": kept_after_replace,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interface", required=True)
    parser.add_argument("--peers", type=int, default=1023)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--keep", default="", help="public key of a peer with a live session")
    args = parser.parse_args()
    args.peers = max(1, min(args.peers, 4096))
    args.repeats = max(1, min(args.repeats, 100))
    result = trio.run(main_async, args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
