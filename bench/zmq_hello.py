#!/usr/bin/env python3
"""A Flux-like broker's hello to rank 0 over ZeroMQ, configured by a rendered bootstrap file.

    zmq_hello.py BOOTSTRAP.toml [--duration S]

The bench's copy of ``tests/e2e/zmq_broker.py`` (flat topology only): the
broker finds its rank as the index of its hostname in the ``[bootstrap]``
``hosts`` array (as Flux does); rank 0 binds a ROUTER on its own ``bind``
URI (waiting for the overlay address to appear) and prints one JSON line per
message, ``{"event": "hello"|"beat", "rank": R, "t": monotonic}``; a worker
connects a DEALER to rank 0's ``connect`` URI (ZeroMQ reconnects on its own,
every 100 ms), sends ``hello`` once and ``beat`` every 0.5 s.

Unlike the test's copy, a worker waits in its poll: pyzmq returns at once
from a poll with no sockets registered, so a worker that polls only its
(absent) ROUTER spins a CPU at 100 % — harmless for 8 pods, not for 64
pods on 2 cores.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import sys
import time
import tomllib
from typing import Any

import zmq

BEAT_INTERVAL = 0.5
BIND_WAIT = 120.0
"""The overlay address appears when the node's vnetd has set up its device."""


def say(record: dict[str, Any]) -> None:
    print(json.dumps({**record, "t": time.monotonic()}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bootstrap")
    parser.add_argument("--duration", type=float, default=600.0)
    args = parser.parse_args()
    with open(args.bootstrap, "rb") as handle:
        bootstrap = tomllib.load(handle)["bootstrap"]
    hosts: list[dict[str, Any]] = bootstrap["hosts"]
    names = [entry["host"] for entry in hosts]
    hostname = socket.gethostname()
    if hostname not in names:
        say({"event": "error", "why": f"{hostname} not in hosts"})
        return 1
    rank = names.index(hostname)
    port = str(bootstrap.get("default_port", 0))

    def uri(r: int, key: str) -> str:
        return str(hosts[r][key]).replace("%p", port).replace("%h", names[r])

    context = zmq.Context()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    end = time.monotonic() + min(args.duration, 3600.0)
    poller = zmq.Poller()
    mine = json.dumps({"rank": rank}).encode()
    if rank == 0:
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + BIND_WAIT
        while True:
            try:
                sock.bind(uri(0, "bind"))
                break
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        say({"event": "up", "rank": 0})
    else:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(uri(0, "connect"))
        sock.send_multipart([b"hello", mine])
        say({"event": "up", "rank": rank})
    poller.register(sock, zmq.POLLIN)
    next_beat = time.monotonic()
    while not stop["now"] and time.monotonic() < end:
        if rank != 0 and time.monotonic() >= next_beat:
            try:
                sock.send_multipart([b"beat", mine], zmq.NOBLOCK)
            except zmq.Again:
                pass  # not connected yet and the queue is full: a beat can be dropped
            next_beat = time.monotonic() + BEAT_INTERVAL
        for ready, _ in poller.poll(timeout=100):
            frames = ready.recv_multipart()
            if rank == 0 and len(frames) == 3:
                say({"event": frames[1].decode(), **json.loads(frames[2])})
    context.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
