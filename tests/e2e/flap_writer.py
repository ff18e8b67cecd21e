"""Register a member and delete it again, N times, through etcd's JSON gateway.

Run inside the lab's etcd namespace: ``python flap_writer.py URL KEY RECORD N GAP``
(``RECORD`` the member's JSON, ``GAP`` seconds between writes, so each reaches a
watcher as an event of its own). Prints one JSON line: {"cycles": N, "seconds": S}.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import httpx


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def main() -> None:
    url, key, record, cycles, gap = sys.argv[1:6]
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        # Under a lease, as a claim is: readers skip an entry bound to none.
        grant = client.post(f"{url}/v3/lease/grant", json={"TTL": "600"})
        lease = grant.raise_for_status().json()["ID"]
        for _ in range(int(cycles)):
            put = {"key": b64(key), "value": b64(record), "lease": lease}
            client.post(f"{url}/v3/kv/put", json=put).raise_for_status()
            time.sleep(float(gap))
            client.post(f"{url}/v3/kv/deleterange", json={"key": b64(key)}).raise_for_status()
            time.sleep(float(gap))
    print(json.dumps({"cycles": int(cycles), "seconds": round(time.monotonic() - started, 2)}))


if __name__ == "__main__":
    main()
