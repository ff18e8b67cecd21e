#!/usr/bin/env python3
"""Scrape etcd's /metrics every second; run inside a lab pod (etcd is reached only there).

    etcd_metrics.py --url http://198.18.0.10:2379 --interval 1 --duration 600

Prints one JSON line per scrape: ``{"t": wall-clock s, "received": {method: n},
"sent": {method: n}, "mvcc": {...}, "lease": {...}, "cpu": s, "proposals": n}``,
all counters since etcd started. ``received`` counts the gRPC messages etcd
received per method (one per unary call, one per lease keepalive, one per
watch created), which is what "requests" means in the results; ``sent``
counts the messages it sent (Watch: batches of events). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request

_LINE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)$")
_METHOD = re.compile(r'grpc_method="(\w+)"')
MVCC = ("put", "range", "txn", "delete", "events")
LEASE = ("granted", "renewed", "revoked")


def parse(text: str) -> dict[str, object]:
    received: dict[str, float] = {}
    sent: dict[str, float] = {}
    mvcc: dict[str, float] = {}
    lease: dict[str, float] = {}
    other: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        name, labels, raw = match.groups()
        value = float(raw)
        method = _METHOD.search(labels or "")
        if name == "grpc_server_msg_received_total" and method and value:
            received[method.group(1)] = received.get(method.group(1), 0) + value
        elif name == "grpc_server_msg_sent_total" and method and value:
            sent[method.group(1)] = sent.get(method.group(1), 0) + value
        elif name.startswith("etcd_debugging_mvcc_") and name.endswith("_total"):
            key = name.removeprefix("etcd_debugging_mvcc_").removesuffix("_total")
            if key in MVCC or key == "watcher":
                mvcc[key] = value
        elif name.startswith("etcd_debugging_lease_") and name.endswith("_total"):
            key = name.removeprefix("etcd_debugging_lease_").removesuffix("_total")
            if key in LEASE:
                lease[key] = value
        elif name in ("process_cpu_seconds_total", "etcd_server_proposals_committed_total"):
            other[name] = value
    return {
        "received": received,
        "sent": sent,
        "mvcc": mvcc,
        "lease": lease,
        "cpu": other.get("process_cpu_seconds_total", 0.0),
        "proposals": other.get("etcd_server_proposals_committed_total", 0.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=600.0)
    args = parser.parse_args()
    end = time.monotonic() + min(args.duration, 3600.0)
    interval = max(args.interval, 0.2)
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"{args.url}/metrics", timeout=5) as response:
                text = response.read().decode()
            record = {"t": time.time(), **parse(text)}
        except (OSError, urllib.error.URLError) as exc:
            record = {"t": time.time(), "error": str(exc)}
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
