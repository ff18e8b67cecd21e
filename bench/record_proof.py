#!/usr/bin/env python3
"""The cost of signed member records (docs/security.md, "Within one credential").

Pure CPU, no lab: for a record as a daemon writes it, its size unsigned and
signed, the time to encode it (the claim's side: once per claim or record
update) and to decode it (every reader, once per watch event, and once per
member in a list), and a reader's view taking one join (an event: a first claim,
taken unproven, and the same record where its proof decides), a list of
``--size`` members into a fresh view (a start) and the same list again (a
re-list, which verifies nothing it verified before), signed against unsigned.

    .venv/bin/python bench/record_proof.py [--size 1024] [--repeat 2000] [--out DIR]

Writes ``bench/results/record_proof.json`` (``--out DIR``: there instead) and
prints its result. Times are CPU time of this process (``time.process_time``,
not wall time: on a loaded machine wall time counts other processes' turns), the
median of ``--rounds`` rounds, in microseconds (lists: milliseconds).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from common import RESULTS, write_result

from vnetd import __version__
from vnetd.control.membership import decode_member, encode_member, member_key
from vnetd.control.proof import Signer
from vnetd.control.watcher import MemberView
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.spec import parse_spec

LEASE = 0x6A6CA2334DAF2108


def timed(function: Callable[[], object], repeat: int, rounds: int) -> float:
    """Median CPU µs per call of ``function`` over ``rounds`` rounds of ``repeat`` calls."""
    per_call = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            function()
        per_call.append((time.process_time() - started) / repeat * 1e6)
    return round(statistics.median(per_call), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="members in the listed view")
    parser.add_argument("--repeat", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    spec = parse_spec({"mesh": {"name": "bench", "size": args.size, "network": "10.0.0.0/8"}})
    signers = [Signer.generate() for _ in range(args.size)]
    members = [
        Member(
            rank, base64.b64encode(os.urandom(32)).decode(),
            f"198.18.{rank // 250}.{rank % 250}:51820", f"bench-{rank}", time.time(),
            __version__, os.urandom(8).hex(),
        )
        for rank in range(args.size)
    ]  # fmt: skip
    keys = [member_key(spec, m.rank) for m in members]
    unsigned = [encode_member(m) for m in members]
    signed = [
        encode_member(replace(m, signing_key=s.public_key), s, key=k, lease=LEASE)
        for m, s, k in zip(members, signers, keys, strict=True)
    ]
    one, one_signed, key, signer = members[1], signed[1], keys[1], signers[1]
    me_signed = replace(one, signing_key=signer.public_key)
    r, n = args.repeat, args.rounds

    def sign() -> bytes:
        return encode_member(me_signed, signer, key=key, lease=LEASE)

    record = {
        "unsigned_bytes": len(unsigned[1]),
        "signed_bytes": len(one_signed),
        "encode_unsigned_us": timed(lambda: encode_member(one), r, n),
        "encode_signed_us": timed(sign, r, n),
        "decode_unsigned_us": timed(lambda: decode_member(spec, key, unsigned[1], LEASE), r, n),
        "decode_signed_us": timed(lambda: decode_member(spec, key, one_signed, LEASE), r, n),
    }  # fmt: skip

    def listed(values: list[bytes], *, again: bool = False) -> Callable[[], object]:
        """A list into a fresh view, or (``again``) a re-list of the same entries."""
        kvs = [
            KeyValue(k, v, i + 1, i + 1, LEASE)
            for i, (k, v) in enumerate(zip(keys, values, strict=True))
        ]
        if not again:
            return lambda: MemberView().replace(spec, kvs, len(kvs))
        view = MemberView()
        view.replace(spec, kvs, len(kvs))
        return lambda: view.replace(spec, kvs, len(kvs))

    def join(values: list[bytes], *, decisive: bool = False) -> Callable[[], object]:
        """A join event: a first claim of fresh keys at a free rank (its proof decides
        nothing, so it is taken unproven), or (``decisive``) the same record as a rewrite
        of the member at that rank (its proof is verified: docs/architecture.md,
        "Proofs where they decide")."""
        kvs = [
            KeyValue(k, v, i + 1, i + 1, LEASE)
            for i, (k, v) in enumerate(zip(keys[:-1], values[:-1], strict=True))
        ]
        view = MemberView()
        view.replace(spec, kvs, len(kvs))
        event = WatchEvent("put", keys[-1], values[-1], len(kvs) + 1, len(kvs) + 1, LEASE)

        rank = len(kvs)

        def apply() -> None:
            view._proven.clear()  # each join is a record never verified before
            view.unproven.clear()
            if not decisive:
                view._drop(rank)  # a free rank again (nothing to verify: cleared above)
            view.apply(spec, event)

        return apply

    list_rounds = max(1, r // args.size)
    record |= {
        "size": args.size,
        "join_event_unsigned_us": timed(join(unsigned), r, n),
        "join_event_signed_us": timed(join(signed), r, n),
        "join_event_signed_decisive_us": timed(join(signed, decisive=True), r, n),
        "list_unsigned_ms": round(timed(listed(unsigned), list_rounds, n) / 1000, 2),
        "list_signed_ms": round(timed(listed(signed), list_rounds, n) / 1000, 2),
        "relist_unsigned_ms": round(timed(listed(unsigned, again=True), list_rounds, n) / 1000, 2),
        "relist_signed_ms": round(timed(listed(signed, again=True), list_rounds, n) / 1000, 2),
    }
    params = {"size": args.size, "repeat": r, "rounds": n, "clock": "process_time"}
    load = {"loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]}
    print(json.dumps(record, indent=2))
    write_result("record_proof", "signed member records: size and CPU", params, [record],
                 record, load, args.out or RESULTS)  # fmt: skip


if __name__ == "__main__":
    main()
