#!/usr/bin/env python3
"""A first packet between two wireguard-go peers that never spoke, without keepalives.

    lazy_handshake.py --trials 50

Two lab pods each run a hand-made wireguard-go (``bench/dataplane.hand_devices``).
Before every trial each side removes the other and adds it again (a fresh
peer: no session, no handshake state, no rate limit), with no persistent
keepalive, so nothing is sent until the application sends. Then, at a
``time.monotonic()`` instant both pods share, a UDP prober in each pod
sends a request every ``--interval`` s to the other's overlay address
until it answers. Cases:

- ``one``: pod 0 alone sends; both hold each other's endpoint.
- ``both``: both send at the same instant; both hold each other's endpoint
  (the all-to-all case: do the crossing initiations both get lost?).
- ``held``: pod 1 holds no endpoint for pod 0 (the pair rule's responder
  today) and pod 1 alone sends.
- ``staggered``: both send, pod 1 ``--stagger`` s after pod 0.

The figure per trial is the time from the go instant to the sender's first
reply (for ``both``, each side's and the later one); ``None`` when no reply
came within ``--limit`` s. Prints one JSON line per case. Nothing leaves the
lab's namespaces. The prober is bench/first_packet.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import trio
from dataplane import HAND_IF, HAND_PORT, hand_address, hand_devices, run_ok

from vnetd.lab.open_lab import Lab, LabProcess, open_lab

PROBER = Path(__file__).resolve().parent / "first_packet.py"
STALL = 4.0
"""A reply later than this waited for WireGuard's 5 s retry."""
SENDERS = {"one": {0}, "both": {0, 1}, "held": {1}, "staggered": {0, 1}}
Replies = dict[int, float | None]
"""Each sending pod's seconds from the go instant to its first reply (None: none)."""


async def reset_pair(
    lab: Lab, devices: dict[int, LabProcess], keys: list[str], endpoints: dict[int, str | None]
) -> None:
    """Remove each side's peer and add it back fresh (no keepalive)."""
    for i in (0, 1):
        pod, peer = lab.pods[i], keys[1 - i]
        await run_ok(lab, pod, ["wg", "set", HAND_IF, "peer", peer, "remove"], beside=devices[i])
        argv = ["wg", "set", HAND_IF, "peer", peer, "allowed-ips", f"{hand_address(1 - i)}/32"]
        endpoint = endpoints[i]
        if endpoint is not None:
            argv += ["endpoint", endpoint]
        await run_ok(lab, pod, argv, beside=devices[i])


async def trial(
    lab: Lab, devices: dict[int, LabProcess], keys: list[str], case: str, args: argparse.Namespace
) -> Replies:
    """One first packet of ``case`` on a fresh pair."""
    held: dict[int, str | None] = {i: f"{lab.pods[1 - i].underlay_ip}:{HAND_PORT}" for i in (0, 1)}
    if case == "held":
        held[1] = None
    await reset_pair(lab, devices, keys, held)
    senders = SENDERS[case]
    go = time.monotonic() + 1.0
    out: dict[int, str] = {}

    async def run(i: int) -> None:
        start = go + (args.stagger if case == "staggered" and i == 1 else 0.0)
        argv = [sys.executable, str(PROBER), "--self-addr", hand_address(i),
                "--peer-addr", hand_address(1 - i), "--go", repr(start),
                "--limit", str(args.limit), "--interval", str(args.interval)]  # fmt: skip
        if i in senders:
            argv.append("--send")
        if 1 - i in senders:
            argv.append("--expect")
        result = await lab.run(lab.pods[i], argv, args.limit + 10, beside=devices[i])
        out[i] = result.stdout.decode()

    async with trio.open_nursery() as nursery:
        for i in (0, 1):
            nursery.start_soon(run, i)
    return {i: json.loads(out[i].strip().splitlines()[-1])["reply"] for i in sorted(senders)}


def summary(case: str, results: list[Replies]) -> dict[str, object]:
    """A case's line: the later side's reply per trial, counted against the 5 s retry."""
    worst = [None if None in r.values() else max(v for v in r.values() if v is not None)
             for r in results]  # fmt: skip
    done = sorted(w for w in worst if w is not None)
    return {
        "case": case,
        "trials": len(results),
        "no_reply": sum(1 for w in worst if w is None),
        "stalled_over_4s": sum(1 for w in done if w > STALL),
        "p50_s": done[len(done) // 2] if done else None,
        "max_s": done[-1] if done else None,
        "under_1s_max": max((w for w in done if w < 1), default=None),
        "each": results,
    }


async def outer(args: argparse.Namespace) -> None:
    async with open_lab(2, with_etcd=False) as lab:
        devices, _ = await hand_devices(lab)
        keys = []
        for i in (0, 1):
            shown = await run_ok(lab, lab.pods[i], ["wg", "show", HAND_IF, "public-key"],
                                 beside=devices[i])  # fmt: skip
            keys.append(shown.strip())
        for case in args.cases.split(","):
            count = args.held_trials if case == "held" else args.trials
            results = [await trial(lab, devices, keys, case, args) for _ in range(count)]
            print(json.dumps(summary(case, results)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="one,both,held,staggered")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--held-trials", type=int, default=3)
    parser.add_argument("--stagger", type=float, default=0.002)
    parser.add_argument("--limit", type=float, default=8.0)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    if not 0 < args.limit <= 30 or not 1 <= args.trials <= 500:
        parser.error("--limit must be in (0, 30] and --trials in [1, 500]")
    trio.run(outer, args)


if __name__ == "__main__":
    main()
