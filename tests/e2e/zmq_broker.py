"""A stand-in for a Flux broker's overlay, for the end-to-end test.

It does what a Flux broker does with a ``[bootstrap]`` table and nothing
more: it finds its rank as the index of the first ``hosts`` entry whose
``host`` equals ``hostname`` (``FLUX_FAKE_HOSTNAME`` instead where set, as
flux-core's ``boot_config`` reads it); it binds a ROUTER on its own entry's ``bind``
URI when it has downstream peers; it connects a DEALER to its parent's
``connect`` URI (rank 0 is everyone's parent unless ``parent`` keys give
a tree). Every URI comes from the file; nothing about the mesh is in here.

Each broker sends ``hello`` once at start and ``beat`` every 0.5 s upstream;
a broker with a parent forwards what its children send. Rank 0 prints one
JSON line per message it receives (``{"event": "hello"|"beat", "rank": R,
"boot": ID, "t": monotonic}``), so the test sees every rank arrive at the
root. ``boot`` is random per process, so a restart is visible.

A leaf polls its DEALER too (nothing arrives on it): pyzmq returns at once
from a poll with no sockets registered, so a leaf would spin a CPU at 100 %,
harmless for 8 pods but not for the 64 of the launcher benchmark
(``bench/launcher.py`` runs this same file).

Run: ``python zmq_broker.py BOOTSTRAP.toml [--duration S] [--bind-wait S]``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import signal
import socket
import sys
import time
import tomllib
from typing import Any

import zmq

BEAT_INTERVAL = 0.5
BIND_WAIT = 30.0
"""Default for ``--bind-wait``: the overlay address appears when the node's vnetd
has set up its device."""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--bind-wait", type=float, default=BIND_WAIT)
    args = parser.parse_args()
    with open(args.bootstrap, "rb") as handle:
        bootstrap = tomllib.load(handle)["bootstrap"]
    hosts: list[dict[str, Any]] = bootstrap["hosts"]
    names = [entry["host"] for entry in hosts]
    # As flux-core's boot_config: FLUX_FAKE_HOSTNAME, when set, is the name looked up.
    hostname = os.environ.get("FLUX_FAKE_HOSTNAME") or socket.gethostname()
    if hostname not in names:
        print(json.dumps({"event": "error", "why": f"{hostname} not in hosts"}), flush=True)
        return 1
    rank = names.index(hostname)
    parents = _parents(hosts, names)
    children = [r for r, p in enumerate(parents) if p == rank]
    port = int(bootstrap.get("default_port", 0))

    def uri(rank_: int, key: str) -> str:
        return str(hosts[rank_][key]).replace("%p", str(port)).replace("%h", names[rank_])

    context = zmq.Context()
    ipv6 = bool(bootstrap.get("enable_ipv6", False))
    router = _router(context, uri(rank, "bind"), ipv6, args.bind_wait) if children else None
    dealer = None
    parent = parents[rank]
    if parent is not None:
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IPV6, int(ipv6))
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(uri(parent, "connect"))
    boot = secrets.token_hex(4)
    _say({"event": "up", "rank": rank, "parent": parent, "children": children, "boot": boot})
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    _serve(rank, boot, router, dealer, args.duration, stop)
    context.destroy(linger=0)
    return 0


def _parents(hosts: list[dict[str, Any]], names: list[str]) -> list[int | None]:
    """Flux's ``custom`` topology: ``parent`` keys, else rank 0 is everyone's parent."""
    if not any("parent" in entry for entry in hosts):
        return [None] + [0] * (len(hosts) - 1)
    return [names.index(e["parent"]) if "parent" in e else None for e in hosts]


def _router(
    context: zmq.Context[zmq.Socket[bytes]], bind: str, ipv6: bool, wait: float
) -> zmq.Socket[bytes]:
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.IPV6, int(ipv6))
    router.setsockopt(zmq.LINGER, 0)
    deadline = time.monotonic() + wait
    while True:
        try:
            router.bind(bind)
            return router
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _serve(
    rank: int,
    boot: str,
    router: zmq.Socket[bytes] | None,
    dealer: zmq.Socket[bytes] | None,
    duration: float,
    stop: dict[str, bool],
) -> None:
    poller = zmq.Poller()
    for sock in (router, dealer):  # a leaf's DEALER keeps the poll from spinning
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    mine = {"rank": rank, "boot": boot}
    if dealer is not None:
        dealer.send_multipart([b"hello", json.dumps(mine).encode()])
    end = time.monotonic() + duration
    next_beat = time.monotonic()
    while not stop["now"] and time.monotonic() < end:
        now = time.monotonic()
        if dealer is not None and now >= next_beat:
            _send(dealer, b"beat", json.dumps(mine).encode())
            next_beat = now + BEAT_INTERVAL
        for sock, _ in poller.poll(timeout=100):
            if sock is not router:
                sock.recv_multipart()  # nothing is sent downstream; drop it
                continue
            _identity, kind, body = sock.recv_multipart()
            if dealer is not None:
                _send(dealer, kind, body)
            else:
                _say({"event": kind.decode(), **json.loads(body)})


def _say(record: dict[str, Any]) -> None:
    print(json.dumps({**record, "t": time.monotonic()}), flush=True)


def _send(dealer: zmq.Socket[bytes], kind: bytes, body: bytes) -> None:
    """Send upstream without blocking; a full queue drops the message (it is a beat)."""
    try:
        dealer.send_multipart([kind, body], zmq.NOBLOCK)
    except zmq.Again:
        pass


if __name__ == "__main__":
    sys.exit(main())
