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

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROBER = Path(__file__).resolve().parent / "first_packet.py"
STALL = 4.0
"""A reply later than this waited for WireGuard's 5 s retry."""


async def reset_pair(lab: object, devices: dict[int, object], keys: list[str],
                     endpoints: dict[int, str | None]) -> None:  # fmt: skip
    """Remove each side's peer and add it back fresh (no keepalive)."""
    from dataplane import HAND_IF, hand_address, run_ok

    for i in (0, 1):
        pod = lab.pods[i]  # type: ignore[attr-defined]
        peer = keys[1 - i]
        await run_ok(lab, pod, ["wg", "set", HAND_IF, "peer", peer, "remove"],  # type: ignore[arg-type]
                     beside=devices[i])  # type: ignore[arg-type]  # fmt: skip
        argv = ["wg", "set", HAND_IF, "peer", peer, "allowed-ips", f"{hand_address(1 - i)}/32"]
        if endpoints[i] is not None:
            argv += ["endpoint", str(endpoints[i])]
        await run_ok(lab, pod, argv, beside=devices[i])  # type: ignore[arg-type]


async def trial(lab: object, devices: dict[int, object], keys: list[str], case: str,
                args: argparse.Namespace) -> dict[str, object]:  # fmt: skip
    from dataplane import HAND_PORT, hand_address

    pods = lab.pods  # type: ignore[attr-defined]
    endpoint = {i: f"{pods[1 - i].underlay_ip}:{HAND_PORT}" for i in (0, 1)}
    held: dict[int, str | None] = dict(endpoint)
    if case == "held":
        held[1] = None
    await reset_pair(lab, devices, keys, held)
    senders = {"one": {0}, "both": {0, 1}, "held": {1}, "staggered": {0, 1}}[case]
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
        result = await lab.run(pods[i], argv, args.limit + 10, beside=devices[i])  # type: ignore[attr-defined]
        out[i] = result.stdout.decode()

    async with trio.open_nursery() as nursery:
        for i in (0, 1):
            nursery.start_soon(run, i)
    replies = {i: json.loads(out[i].strip().splitlines()[-1])["reply"] for i in sorted(senders)}
    return {"case": case, "replies": replies}


async def outer(args: argparse.Namespace) -> None:
    from dataplane import hand_devices, wg_keypair  # noqa: F401

    from vnetd.lab.open_lab import open_lab

    async with open_lab(2, with_etcd=False) as lab:
        devices, _ = await hand_devices(lab)
        keys = []
        for i in (0, 1):
            text = await lab.run(lab.pods[i], ["wg", "show", "wgb0", "public-key"],
                                 beside=devices[i])  # fmt: skip
            keys.append(text.stdout.decode().strip())
        for case in args.cases.split(","):
            count = args.held_trials if case == "held" else args.trials
            results = [await trial(lab, devices, keys, case, args) for _ in range(count)]
            worst = [
                None if None in r["replies"].values() else max(r["replies"].values())  # type: ignore[union-attr, type-var]
                for r in results
            ]
            done = sorted(w for w in worst if w is not None)
            print(json.dumps({
                "case": case, "trials": count,
                "no_reply": sum(1 for w in worst if w is None),
                "stalled_over_4s": sum(1 for w in done if w > STALL),
                "p50_s": done[len(done) // 2] if done else None,
                "max_s": done[-1] if done else None,
                "under_1s_max": max((w for w in done if w < 1), default=None),
                "each": [r["replies"] for r in results],
            }), flush=True)  # fmt: skip


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
