#!/usr/bin/env python3
"""A UDP prober that stops probing a target once it has answered; run inside a lab pod.

    first_contact.py --self-addr A --targets A1,A2,... --interval 0.05 --duration 300

With ``--go-file PATH`` it answers requests at once but sends none of its own
until PATH exists (checked every 5 ms), so every prober of a lab can start
sending at the same moment, as an application's first all-to-all does.

Like ``vnetd.lab.probe`` (same ``reached`` events, so ``MeshLab.first_reached``
reads its output), but a target that answered once is no longer probed, and
a target the kernel has no route to yet (the send fails at once: vnetd routes
the overlay ``unreachable`` until the rank is a peer) is tried again only
every ``--unrouted-interval`` s: the bench needs only the first exchange of
each ordered pair, and 64 probers sending to 63 targets 20 times a second
would load the 2-core machine they measure. It keeps answering requests
until the duration ends or SIGTERM. Events, one JSON line each (``t`` is ``time.monotonic()``):

- ``{"event": "started", "self": A, "t": T}``
- ``{"event": "go", "t": T}``: the go file appeared (only with ``--go-file``)
- ``{"event": "reached", "target": A, "t": T}``: the first reply from A
- ``{"event": "summary", "sent": n, "failed": n, "t": T}`` on exit
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time
from types import FrameType

MAGIC = b"vnetd-first1"
PORT = 7778
GO_POLL = 0.005


def emit(event: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--self-addr", required=True)
    parser.add_argument("--targets", required=True)
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument(
        "--unrouted-interval",
        type=float,
        default=0.2,
        help="retry interval for a target the kernel has no route to yet (default 0.2 s)",
    )
    parser.add_argument("--go-file", help="send nothing until this file exists")
    args = parser.parse_args()
    if not 0 < args.duration <= 3600 or not 0.005 <= args.interval <= 10:
        parser.error("--duration must be in (0, 3600] and --interval in [0.005, 10]")
    pending = [t for t in args.targets.split(",") if t and t != args.self_addr]
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sent = failed = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", args.port))
        sock.setblocking(False)
        start = time.monotonic()
        end = start + args.duration
        emit({"event": "started", "self": args.self_addr, "t": start})
        next_send = start
        due = dict.fromkeys(pending, start)  # when each target is probed next
        waiting = args.go_file is not None
        while not stop and time.monotonic() < end:
            now = time.monotonic()
            if waiting and os.path.exists(args.go_file):
                waiting = False
                next_send = now
                due = dict.fromkeys(pending, now)
                emit({"event": "go", "t": now})
            if waiting:
                next_send = now + GO_POLL
            elif now >= next_send:
                for target in pending:
                    if due[target] > now:
                        continue
                    sent += 1
                    try:
                        sock.sendto(b"%s req %s" % (MAGIC, target.encode()), (target, args.port))
                        due[target] = now + args.interval
                    except OSError:  # no route yet: the target is not this pod's peer
                        failed += 1
                        due[target] = now + args.unrouted_interval
                next_send = max(next_send + args.interval, now)
            try:
                readable, _, _ = select.select([sock], [], [], max(0.0, next_send - now))
            except InterruptedError:
                continue
            for _ in range(4096 if readable else 0):
                try:
                    data, addr = sock.recvfrom(2048)
                except BlockingIOError:
                    break
                except OSError:
                    continue
                parts = data.split()
                if len(parts) != 3 or parts[0] != MAGIC:
                    continue
                if parts[1] == b"req":
                    try:
                        sock.sendto(b"%s rep %s" % (MAGIC, parts[2]), addr)
                    except OSError:
                        pass
                elif parts[1] == b"rep":
                    target = parts[2].decode(errors="replace")
                    if target in pending:
                        pending.remove(target)
                        emit({"event": "reached", "target": target, "t": time.monotonic()})
    emit({"event": "summary", "sent": sent, "failed": failed, "t": time.monotonic()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
