#!/usr/bin/env python3
"""The cost of records vouched for by the mesh (``[mesh] rank_ca``, docs/architecture.md,
"Rank certificates").

Pure CPU, no lab: a rank certificate's size; verifying one the first time (parse with
cryptography, Ed25519 signature with libsodium) and each time after (the cache: a
SHA-256 of the DER, a lookup, the rank, key and expiry compares); decoding a signed
record with and without ``rank_ca`` (a certificate seen before, and one never seen);
a list of ``--size`` vouched members into a fresh view and a fresh cache (a start).

    .venv/bin/python bench/rank_cert.py [--size 1024] [--repeat 2000] [--out DIR]

Writes ``bench/results/rank_cert.json`` (``--out DIR``: there instead) and prints it.
Times are CPU time of this process, the median of ``--rounds`` rounds, in µs (the
list: ms). Not yet in ``bench/run_all`` nor the report.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
from pathlib import Path

from common import RESULTS, write_result
from record_proof import LEASE, timed

from vnetd import __version__
from vnetd.control import rank_cert
from vnetd.control.membership import decode_member, encode_member, member_key
from vnetd.control.proof import Signer
from vnetd.control.watcher import MemberView
from vnetd.model import Member
from vnetd.registry.base import KeyValue
from vnetd.spec import parse_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="members in the listed view")
    parser.add_argument("--repeat", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    ca = Signer.generate()
    mesh = {"name": "bench", "size": args.size, "network": "10.0.0.0/8"}
    plain = parse_spec({"mesh": mesh})
    vouched = parse_spec({"mesh": mesh | {"rank_ca": [ca.public_key]}})
    signers = [Signer.generate() for _ in range(args.size)]
    certs = [
        base64.b64encode(
            rank_cert.issue(ca, s.public_key, rank_cert.rank_uri("bench", rank), days=1)
        ).decode()  # fmt: skip
        for rank, s in enumerate(signers)
    ]
    keys = [member_key(vouched, rank) for rank in range(args.size)]
    values = [
        encode_member(Member(
            rank, base64.b64encode(os.urandom(32)).decode(),
            f"198.18.{rank // 250}.{rank % 250}:51820", f"bench-{rank}", time.time(),
            __version__, os.urandom(8).hex(), signing_key=s.public_key, cert=cert,
        ), s, key=k, lease=LEASE)
        for rank, (s, cert, k) in enumerate(zip(signers, certs, keys, strict=True))
    ]  # fmt: skip
    der = base64.b64decode(certs[1])
    r, n = args.repeat, args.rounds
    warm = rank_cert.CertCache()
    rank_cert.refusal(vouched, 1, signers[1].public_key, certs[1], cache=warm)

    def first_decode() -> object:
        rank_cert.CACHE.clear()  # a certificate never seen
        return decode_member(vouched, keys[1], values[1], LEASE)

    def listed() -> object:
        rank_cert.CACHE.clear()
        pairs = enumerate(zip(keys, values, strict=True))
        kvs = [KeyValue(k, v, i + 1, i + 1, LEASE) for i, (k, v) in pairs]
        return MemberView().replace(vouched, kvs, len(kvs))

    record = {
        "size": args.size,
        "cert_der_bytes": len(der),
        "record_bytes": len(values[1]),
        "cert_first_us": timed(lambda: rank_cert.read_cert(der, vouched.rank_ca), r, n),
        "cert_cached_us": timed(
            lambda: rank_cert.refusal(vouched, 1, signers[1].public_key, certs[1], cache=warm), r, n
        ),  # fmt: skip
        "decode_signed_us": timed(lambda: decode_member(plain, keys[1], values[1], LEASE), r, n),
        "decode_vouched_cached_us": timed(
            lambda: decode_member(vouched, keys[1], values[1], LEASE), r, n
        ),  # fmt: skip
        "decode_vouched_first_us": timed(first_decode, r, n),
        "list_vouched_ms": round(timed(listed, max(1, r // args.size), n) / 1000, 2),
    }
    params = {"size": args.size, "repeat": r, "rounds": n, "clock": "process_time"}
    load = {"loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]}
    print(json.dumps(record, indent=2))
    write_result("rank_cert", "rank certificates: size and CPU", params, [record], record,
                 load, args.out or RESULTS)  # fmt: skip


if __name__ == "__main__":
    main()
