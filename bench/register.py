#!/usr/bin/env python3
"""Write member registrations into etcd the way a daemon's claim does; run inside a lab pod.

    register.py join  --etcd URL --spec mesh.toml --rank R --public-key K --endpoint IP:PORT
    register.py leave --etcd URL --lease ID
    register.py seed  --etcd URL --spec mesh.toml --ranks 1-1023 [--endpoint-base 198.18.200.0]
    register.py move  --etcd URL --spec mesh.toml --rank R --endpoint IP:PORT
    register.py storm --etcd URL --spec mesh.toml --ranks 1-1023 [--rate 25] [--per-txn 1]

``join`` grants a lease and creates ``members/<rank>`` under it with the
claim's own transaction (create if absent), timing the transaction:
``t_send`` just before the request, ``t_ack`` when etcd's answer is in
(wall clock, epoch seconds). Run it with real-time priority (``chrt -f``)
so that nothing else on a loaded machine sits between the commit and
``t_ack``. ``leave`` revokes the lease, as a daemon's SIGTERM does.
``seed`` puts valid records for many ranks (under one lease of ``--ttl``) with random X25519
public keys and endpoints that nobody answers (``--endpoint-base`` plus the
rank, port from the spec); ``move`` rewrites one record
with a new endpoint. ``storm`` writes signed records for many ranks as their
claims would (each with its own Ed25519 signing key, under one lease), ``--per-txn``
per transaction at ``--rate`` records per second (``--unsigned``: as older versions
wrote them; ``--rank-ca-key FILE``: each with a rank certificate for its signing
key from that CA, as in a mesh that pins ``[mesh] rank_ca``): the joins a daemon
takes in a storm (``bench/join_storm.py``). Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from vnetd import __version__
from vnetd.control.membership import encode_member, member_key
from vnetd.model import Member
from vnetd.ranks import parse_ranks
from vnetd.spec import load_spec

if TYPE_CHECKING:
    from vnetd.control.proof import Signer

TIMEOUT = 10.0
BATCH = 100
"""Puts per transaction (etcd allows 128 operations per transaction by default)."""


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def random_public_key() -> str:
    """A valid X25519 public key (that of a fresh random private key)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def post(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"{url}{path}", json=body)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    if data.get("error"):
        raise SystemExit(f"register: etcd {path}: {data}")
    return data


def record(rank: int, public_key: str, endpoint: str, instance: str) -> bytes:
    member = Member(rank, public_key, endpoint, instance, time.time(), __version__)
    return encode_member(member)


def join(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.spec)
    key = member_key(spec, args.rank)
    value = record(args.rank, args.public_key, args.endpoint, f"bench-{args.rank}")
    lease = int(post(client, args.etcd, "/v3/lease/grant", {"TTL": str(args.ttl)})["ID"])
    body = {
        "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL",
                     "create_revision": "0"}],
        "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}],
        "failure": [{"request_range": {"key": b64(key)}}],
    }  # fmt: skip
    t_send = time.time()
    data = post(client, args.etcd, "/v3/kv/txn", body)
    t_ack = time.time()
    return {"event": "join", "rank": args.rank, "lease": lease, "t_send": t_send,
            "t_ack": t_ack, "succeeded": bool(data.get("succeeded", False)),
            "revision": int(data["header"]["revision"])}  # fmt: skip


def leave(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    t_send = time.time()
    post(client, args.etcd, "/v3/lease/revoke", {"ID": str(args.lease)})
    return {"event": "leave", "lease": args.lease, "t_send": t_send, "t_ack": time.time()}


def endpoint_of(base: str, index: int, port: int) -> str:
    a, b, c, d = (int(x) for x in base.split("."))
    value = (a << 24 | b << 16 | c << 8 | d) + index
    return f"{value >> 24 & 255}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}:{port}"


def seed(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.spec)
    ranks = parse_ranks(args.ranks, spec.size)
    puts = []
    # One lease for all: readers skip an entry bound to none (docs/architecture.md).
    lease = int(post(client, args.etcd, "/v3/lease/grant", {"TTL": str(args.ttl)})["ID"])
    for rank in ranks:
        value = record(rank, random_public_key(), endpoint_of(args.endpoint_base, rank, spec.port),
                       f"bench-seed-{rank}")  # fmt: skip
        puts.append({"request_put": {"key": b64(member_key(spec, rank)), "value": b64(value),
                                     "lease": str(lease)}})  # fmt: skip
    t_send = time.time()
    for start in range(0, len(puts), BATCH):
        post(client, args.etcd, "/v3/kv/txn", {"success": puts[start : start + BATCH]})
    return {"event": "seed", "ranks": len(ranks), "t_send": t_send, "t_ack": time.time()}


def move(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.spec)
    key = member_key(spec, args.rank)
    kvs = post(client, args.etcd, "/v3/kv/range", {"key": b64(key)}).get("kvs", [])
    if not kvs:
        raise SystemExit(f"register: rank {args.rank} is not registered")
    current = json.loads(base64.b64decode(kvs[0]["value"]))
    current["endpoint"] = args.endpoint
    value = json.dumps(current, sort_keys=True, separators=(",", ":")).encode()
    lease = kvs[0].get("lease", "0")
    t_send = time.time()
    post(client, args.etcd, "/v3/kv/put", {"key": b64(key), "value": b64(value), "lease": lease})
    return {"event": "move", "rank": args.rank, "t_send": t_send, "t_ack": time.time()}


def rank_cert_of(ca: Signer | None, mesh: str, rank: int, signer: Signer | None) -> str:
    """A rank certificate (base64 DER) from ``ca`` for ``signer``'s key at ``rank``; ""
    without a CA or a signer."""
    from vnetd.control.rank_cert import issue, rank_uri

    if ca is None or signer is None:
        return ""
    der = issue(ca, signer.public_key, rank_uri(mesh, rank), days=1)
    return base64.b64encode(der).decode()


def storm(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    from vnetd.control.proof import Signer, load_signer

    spec = load_spec(args.spec)
    ranks = parse_ranks(args.ranks, spec.size)
    ca = load_signer(args.rank_ca_key) if args.rank_ca_key else None
    lease = int(post(client, args.etcd, "/v3/lease/grant", {"TTL": str(args.ttl)})["ID"])
    puts = []
    for rank in ranks:
        signer, key = None if args.unsigned else Signer.generate(), member_key(spec, rank)
        member = Member(rank, random_public_key(), endpoint_of(args.endpoint_base, rank, spec.port),
                        f"bench-storm-{rank}", time.time(), __version__,
                        signing_key=signer.public_key if signer else "",
                        cert=rank_cert_of(ca, spec.name, rank, signer))  # fmt: skip
        value = encode_member(member, signer, key=key, lease=lease)
        puts.append({"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}})
    t_send = time.time()
    for i, start in enumerate(range(0, len(puts), args.per_txn)):
        delay = t_send + i * args.per_txn / args.rate - time.time()
        if delay > 0:
            time.sleep(delay)
        post(client, args.etcd, "/v3/kv/txn", {"success": puts[start : start + args.per_txn]})
    return {"event": "storm", "ranks": len(ranks), "lease": lease, "t_send": t_send,
            "t_ack": time.time()}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("join", "leave", "seed", "move", "storm"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--etcd", required=True, help="etcd client URL")
        if name != "leave":
            cmd.add_argument("--spec", type=Path, required=True)
    join_cmd = sub.choices["join"]
    join_cmd.add_argument("--rank", type=int, required=True)
    join_cmd.add_argument("--public-key", required=True)
    join_cmd.add_argument("--endpoint", required=True)
    join_cmd.add_argument("--ttl", type=int, default=10)
    sub.choices["leave"].add_argument("--lease", type=int, required=True)
    seed_cmd = sub.choices["seed"]
    seed_cmd.add_argument("--ranks", required=True, help="e.g. 1-1023")
    seed_cmd.add_argument("--endpoint-base", default="198.18.200.0")
    seed_cmd.add_argument("--ttl", type=int, default=3600, help="the records' lease TTL")
    move_cmd = sub.choices["move"]
    move_cmd.add_argument("--rank", type=int, required=True)
    move_cmd.add_argument("--endpoint", required=True)
    storm_cmd = sub.choices["storm"]
    storm_cmd.add_argument("--ranks", required=True, help="e.g. 1-1023")
    storm_cmd.add_argument("--rate", type=float, default=25.0, help="records per second")
    storm_cmd.add_argument("--per-txn", type=int, default=1, help="records per transaction")
    storm_cmd.add_argument("--ttl", type=int, default=600, help="the records' lease TTL")
    storm_cmd.add_argument("--endpoint-base", default="198.18.200.0")
    storm_cmd.add_argument("--unsigned", action="store_true", help="as older versions wrote")
    storm_cmd.add_argument("--rank-ca-key", type=Path,
                           help="give each record a rank certificate from this CA key")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    commands = {"join": join, "leave": leave, "seed": seed, "move": move, "storm": storm}
    with httpx.Client(timeout=TIMEOUT) as client:
        result = commands[args.command](client, args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
