"""Write N junk keys under a prefix through etcd's JSON gateway, in transactions.

Run inside the lab's etcd namespace: ``python junk_writer.py URL PREFIX N``.
Prints one JSON line: {"written": N, "seconds": S}.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import httpx

BATCH = 128  # etcd's default --max-txn-ops


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def main() -> None:
    url, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        for first in range(0, count, BATCH):
            puts = [
                {"request_put": {"key": b64(f"{prefix}junk-{i}"), "value": b64(f"{{junk {i}")}}
                for i in range(first, min(count, first + BATCH))
            ]
            response = client.post(f"{url}/v3/kv/txn", json={"success": puts})
            response.raise_for_status()
    print(json.dumps({"written": count, "seconds": round(time.monotonic() - started, 2)}))


if __name__ == "__main__":
    main()
