"""A tiny UDP prober and responder, run inside each lab pod (stdlib only, starts fast).

    python -m vnetd.lab.probe --self-addr A --targets A1,A2 --port 7777 \\
        --interval 0.1 --duration 30

It answers echo requests on ``--port`` (all local addresses, IPv4 and IPv6)
and sends one request per target per interval (``--self-addr`` is skipped, so
every pod can get the same target list); targets may be of either family.
It prints one JSON line per event on stdout:

- ``{"event": "started", "self": A, "port": P, "t": T}`` once it listens;
- ``{"event": "reached", "target": A, "t": T}`` the first time a target answers;
- ``{"event": "lost", "target": A, "t": T}`` when a target that answered stays
  silent for ``--lost-after`` s, and ``{"event": "recovered", ...}`` when it
  answers again;
- ``{"event": "miss", "target": A, "seq": n, "sent": T0, "t": T}`` when a request
  sent at ``T0`` to a target that had already answered (an established pair)
  got no reply within ``--miss-after`` s: one line per lost request, so the
  loss of a pair over any time window can be counted afterwards;
- ``{"event": "counters", "sent": {A: n}, "received": {A: n}, "t": T}`` every
  ``--report-every`` s (off by default), to count replies over a window;
- ``{"event": "summary", "sent": {A: n}, "received": {A: n}, "errors": {A: n}}``
  on exit (``--duration`` reached, SIGTERM or SIGINT).

``T`` is ``time.monotonic()``, which all processes on one machine share. A send
that fails (no route, EHOSTUNREACH) is counted in ``errors`` and never crashes it.
Replies carry the target address in the payload, so a reply from a different
source address still counts for the right target.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

MAGIC = b"vnetd-probe1"
MAX_DURATION = 3600.0
DEFAULT_PORT = 7777


@dataclass
class TargetState:
    """Counters and reachability of one target."""

    sent: int = 0
    received: int = 0
    errors: int = 0
    reached: bool = False
    lost: bool = False
    last_reply: float = 0.0
    pending: dict[int, float] = field(default_factory=dict)
    """Requests sent since the target first answered: seq -> when, until answered."""


@dataclass
class Prober:
    """Sends requests, answers requests, and reports events as JSON lines."""

    self_addr: str
    targets: list[str]
    port: int
    lost_after: float
    miss_after: float = 1.0
    state: dict[str, TargetState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = {t: TargetState() for t in self.targets}

    def send_round(self, sock: socket.socket, seq: int, sock6: socket.socket | None = None) -> None:
        """One request to every target (IPv6 ones through ``sock6``); a failing send
        counts as an error."""
        now = time.monotonic()
        for target in self.targets:
            st = self.state[target]
            st.sent += 1
            if st.reached:
                st.pending[seq] = now
            out = sock6 if ":" in target else sock
            try:
                if out is None:
                    raise OSError(f"no IPv6 socket for {target}")
                out.sendto(b"%s req %d %s" % (MAGIC, seq, target.encode()), (target, self.port))
            except OSError:
                st.errors += 1

    def handle(self, sock: socket.socket, data: bytes, addr: tuple[str, int]) -> None:
        """Answer a request, or account a reply."""
        parts = data.split()
        if len(parts) != 4 or parts[0] != MAGIC:
            return
        kind, seq, target = parts[1], parts[2], parts[3]
        if kind == b"req":
            try:
                sock.sendto(b"%s rep %s %s" % (MAGIC, seq, target), addr)
            except OSError:
                pass
        elif kind == b"rep" and seq.isdigit():
            self.on_reply(target.decode(errors="replace"), int(seq))

    def on_reply(self, target: str, seq: int) -> None:
        st = self.state.get(target)
        if st is None:
            return
        now = time.monotonic()
        st.pending.pop(seq, None)
        st.received += 1
        st.last_reply = now
        if not st.reached:
            st.reached = True
            emit({"event": "reached", "target": target, "t": now})
        elif st.lost:
            st.lost = False
            emit({"event": "recovered", "target": target, "t": now})

    def check_lost(self) -> None:
        now = time.monotonic()
        for target, st in self.state.items():
            if st.reached and not st.lost and now - st.last_reply > self.lost_after:
                st.lost = True
                emit({"event": "lost", "target": target, "t": now})

    def check_missed(self) -> None:
        """Report each request of an established pair unanswered for ``miss_after`` s."""
        now = time.monotonic()
        for target, st in self.state.items():
            late = [seq for seq, sent in st.pending.items() if now - sent > self.miss_after]
            for seq in late:
                sent = st.pending.pop(seq)
                emit({"event": "miss", "target": target, "seq": seq, "sent": sent, "t": now})

    def counters(self) -> dict[str, Any]:
        return {
            "event": "counters",
            "sent": {t: s.sent for t, s in self.state.items()},
            "received": {t: s.received for t, s in self.state.items()},
            "t": time.monotonic(),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "event": "summary",
            "sent": {t: s.sent for t, s in self.state.items()},
            "received": {t: s.received for t, s in self.state.items()},
            "errors": {t: s.errors for t, s in self.state.items()},
            "t": time.monotonic(),
        }


def emit(event: dict[str, Any]) -> None:
    """One JSON line on stdout, flushed at once."""
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    """Probe until the duration ends or a signal arrives; returns the exit code."""
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    targets = [t for t in args.targets if t != args.self_addr]
    prober = Prober(args.self_addr, targets, args.port, args.lost_after, args.miss_after)
    sock6 = _ipv6_socket(args.port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", args.port))
        sock.setblocking(False)
        sockets = [s for s in (sock, sock6) if s is not None]
        start = time.monotonic()
        end = start + args.duration
        emit({"event": "started", "self": args.self_addr, "port": args.port, "t": start})
        next_send, seq = start, 0
        next_report = start + args.report_every if args.report_every else float("inf")
        while not stop:
            now = time.monotonic()
            if now >= end:
                break
            if now >= next_send:
                for s in sockets:  # replies that came while this process was not running
                    drain(s, prober)
                prober.send_round(sock, seq, sock6)
                prober.check_lost()
                prober.check_missed()
                seq += 1
                next_send = max(next_send + args.interval, now)
            if now >= next_report:
                emit(prober.counters())
                next_report = max(next_report + args.report_every, now)
            wait = max(0.0, min(next_send, end) - time.monotonic())
            try:
                readable, _, _ = select.select(sockets, [], [], wait)
            except InterruptedError:
                continue
            for s in readable:
                drain(s, prober)
    if sock6 is not None:
        sock6.close()
    emit(prober.summary())
    return 0


def _ipv6_socket(port: int) -> socket.socket | None:
    """A non-blocking IPv6-only UDP socket on ``[::]:port``; None where IPv6 is off."""
    try:
        sock6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock6.bind(("::", port))
    except OSError:
        sock6.close()
        return None
    sock6.setblocking(False)
    return sock6


def drain(sock: socket.socket, prober: Prober, limit: int = 4096) -> None:
    """Handle the datagrams waiting on ``sock`` (at most ``limit``) without blocking."""
    for _ in range(limit):
        try:
            data, addr = sock.recvfrom(2048)
        except BlockingIOError:
            return
        except OSError:
            continue
        prober.handle(sock, data, addr)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vnetd.lab.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--self-addr", required=True, type=_address, help="this pod's address")
    parser.add_argument(
        "--targets",
        required=True,
        type=_address_list,
        help="comma-separated addresses to probe (IPv4 or IPv6)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between rounds")
    parser.add_argument(
        "--duration", required=True, type=float, help=f"seconds to run (max {MAX_DURATION:g})"
    )
    parser.add_argument(
        "--lost-after", type=float, default=None, help="silence (s) that counts as lost"
    )
    parser.add_argument(
        "--miss-after",
        type=float,
        default=1.0,
        help="seconds without a reply after which a request counts as lost (default 1)",
    )
    parser.add_argument(
        "--report-every",
        type=float,
        default=0.0,
        help="print the counters every this many seconds (default 0: never)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION:
        parser.error(f"--duration must be in (0, {MAX_DURATION:g}], got {args.duration}")
    if not 0.001 <= args.interval <= 60:
        parser.error(f"--interval must be in [0.001, 60], got {args.interval}")
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if not 0.01 <= args.miss_after <= 60:
        parser.error(f"--miss-after must be in [0.01, 60], got {args.miss_after}")
    if args.report_every < 0:
        parser.error(f"--report-every must not be negative, got {args.report_every}")
    if args.lost_after is None:
        args.lost_after = max(1.0, 10 * args.interval)
    return args


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def _address_list(text: str) -> list[str]:
    return [_address(t) for t in text.split(",") if t.strip()]


def probe_command(
    self_addr: str,
    targets: Sequence[str],
    *,
    duration: float,
    port: int = DEFAULT_PORT,
    interval: float = 0.1,
    report_every: float = 0.0,
    lost_after: float | None = None,
) -> list[str]:
    """The argv that runs this prober with the current Python (for ``Lab.start``);
    ``lost_after`` None keeps the probe's default (10 rounds, at least 1 s)."""
    lost = ["--lost-after", str(lost_after)] if lost_after is not None else []
    return [
        sys.executable, "-m", "vnetd.lab.probe",
        "--self-addr", self_addr, "--targets", ",".join(targets),
        "--port", str(port), "--interval", str(interval), "--duration", str(duration),
        "--report-every", str(report_every), *lost,
    ]  # fmt: skip


def parse_events(text: str) -> list[dict[str, Any]]:
    """The JSON event lines of a probe's output (other lines are skipped)."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
