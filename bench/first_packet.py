#!/usr/bin/env python3
"""A first packet and its reply, timed from a shared instant; run inside a lab pod.

    first_packet.py --self-addr A --peer-addr B --go T [--send] [--expect] [--limit S]

From ``time.monotonic()`` = T (every namespace of one host shares the clock)
it sends a request to B every ``--interval`` s until one is answered
(``--send``), and answers every request it gets. It stops once it has its
reply (or is not sending) and, with ``--expect`` (the other side sends too),
has heard nothing for 0.5 s; at T + ``--limit`` at the latest. Prints one
JSON line: ``{"reply": seconds from T to the first reply, or null}``.
Used by bench/lazy_handshake.py and tests/e2e/test_lazy_handshakes.py.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

PORT = 7779


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-addr", required=True)
    parser.add_argument("--peer-addr", required=True)
    parser.add_argument("--go", type=float, required=True)
    parser.add_argument("--send", action="store_true")
    parser.add_argument("--expect", action="store_true")
    parser.add_argument("--port", type=int, default=PORT, help="UDP port on both sides")
    parser.add_argument("--limit", type=float, default=8.0)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    if not 0 < args.limit <= 30 or not 0.001 <= args.interval <= 1:
        parser.error("--limit must be in (0, 30] and --interval in [0.001, 1]")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.self_addr, args.port))
    sock.settimeout(0.005)
    while time.monotonic() < args.go:
        time.sleep(min(0.001, max(0.0, args.go - time.monotonic())))
    go, end = args.go, args.go + args.limit
    sent_at = -1.0
    replied: float | None = None
    last_request: float | None = None
    while time.monotonic() < end:
        now = time.monotonic()
        if args.send and replied is None and now - sent_at >= args.interval:
            sent_at = now
            try:
                sock.sendto(b"q", (args.peer_addr, args.port))
            except OSError:
                pass  # no route yet
        try:
            data, source = sock.recvfrom(16)
        except TimeoutError:
            data = b""
        now = time.monotonic()
        if data == b"q":
            last_request = now
            sock.sendto(b"r", source)
        elif data == b"r" and replied is None:
            replied = now
        done = replied is not None or not args.send
        answered = not args.expect or (last_request is not None and now - last_request > 0.5)
        if done and answered:
            break
    print(json.dumps({"reply": None if replied is None else round(replied - go, 4)}))


if __name__ == "__main__":
    main()
