"""Fill etcd to its quota through the JSON gateway, as any writer of one key could: puts
of VALUE_BYTES to KEY, at most MAX_PUTS, until etcd refuses one (each put keeps its
revision until a compaction, so one key is enough):
``python quota_filler.py URL KEY VALUE_BYTES MAX_PUTS``.

Prints one JSON line: {"puts": accepted, "status": the refusal's HTTP status or null,
"body": its body, "seconds": S}. Run inside a pod of the lab.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import httpx


def main() -> None:
    url, key = sys.argv[1], sys.argv[2].encode()
    value_bytes, max_puts = int(sys.argv[3]), int(sys.argv[4])
    body = {"key": base64.b64encode(key).decode(),
            "value": base64.b64encode(b"{" * value_bytes).decode()}  # fmt: skip
    started = time.monotonic()
    puts, status, answer = 0, None, None
    with httpx.Client(timeout=10) as client:
        for _ in range(max_puts):
            response = client.post(f"{url}/v3/kv/put", json=body)
            if response.status_code != 200:
                status, answer = response.status_code, response.json()
                break
            puts += 1
    print(json.dumps({"puts": puts, "status": status, "body": answer,
                      "seconds": round(time.monotonic() - started, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
