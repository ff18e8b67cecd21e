#!/usr/bin/env python3
"""A TCP hello to rank 0 by hostname, with the operator's retry loop; run inside a lab pod.

    hello.py serve   --port P --duration S
    hello.py connect --host lab-0 --port P --rank R --retry 15 --attempts 20

``serve`` (rank 0) accepts connections, reads ``hello <rank>``, answers
``ok`` and prints ``{"event": "hello", "rank": R, "t": T}``. ``connect``
(a worker) resolves the host name (through ``/etc/hosts``), connects, says
hello and waits for ``ok``; on any failure it prints ``{"event": "failed",
...}`` and tries again ``--retry`` s later, as the launcher's loop did. ``T``
is ``time.monotonic()``. Standard library only, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time
from types import FrameType


def say(record: dict[str, object]) -> None:
    print(json.dumps({**record, "t": time.monotonic()}), flush=True)


def serve(port: int, duration: float) -> int:
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    end = time.monotonic() + duration
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(1024)
        server.settimeout(0.2)
        say({"event": "listening", "port": port})
        while not stop and time.monotonic() < end:
            try:
                conn, _ = server.accept()
            except (TimeoutError, InterruptedError):
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    words = conn.recv(256).decode(errors="replace").split()
                    if len(words) == 2 and words[0] == "hello" and words[1].isdigit():
                        conn.sendall(b"ok\n")
                        say({"event": "hello", "rank": int(words[1])})
                except OSError:
                    continue
    return 0


def connect(host: str, port: int, rank: int, retry: float, attempts: int) -> int:
    for attempt in range(1, attempts + 1):
        try:
            info = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
            with socket.create_connection((str(info[0][4][0]), port), timeout=5.0) as conn:
                conn.sendall(f"hello {rank}\n".encode())
                if conn.recv(16).strip() != b"ok":
                    raise OSError("no ok from rank 0")
            say({"event": "connected", "rank": rank, "attempt": attempt})
            return 0
        except OSError as exc:
            say({"event": "failed", "rank": rank, "attempt": attempt, "why": str(exc)})
        if attempt < attempts:
            time.sleep(retry)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--duration", type=float, default=600.0)
    cli = sub.add_parser("connect")
    cli.add_argument("--host", required=True)
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--rank", type=int, required=True)
    cli.add_argument("--retry", type=float, default=15.0)
    cli.add_argument("--attempts", type=int, default=20)
    args = parser.parse_args()
    if args.command == "serve":
        return serve(args.port, min(args.duration, 3600.0))
    return connect(args.host, args.port, args.rank, args.retry, max(1, min(args.attempts, 100)))


if __name__ == "__main__":
    sys.exit(main())
