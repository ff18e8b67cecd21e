"""Write big junk under a prefix through etcd's JSON gateway, one put per key:
``python junk_big_writer.py URL PREFIX VALUES VALUE_BYTES NAMES NAME_BYTES``.

VALUES keys ``PREFIX big-value-<i>`` with VALUE_BYTES each, and NAMES keys whose
names are NAME_BYTES long with a one-byte value. Prints one JSON line:
{"values": N, "names": M, "seconds": S}. Run inside the lab's etcd namespace.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import httpx


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def main() -> None:
    url, prefix = sys.argv[1], sys.argv[2].encode()
    values, value_bytes, names, name_bytes = map(int, sys.argv[3:7])
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        puts = [(prefix + b"big-value-%d" % i, b"{" * value_bytes) for i in range(values)]
        puts += [(prefix + b"n" * name_bytes + b"-%d" % i, b"{") for i in range(names)]
        for key, value in puts:
            response = client.post(f"{url}/v3/kv/put", json={"key": b64(key), "value": b64(value)})
            response.raise_for_status()
    print(json.dumps({"values": values, "names": names,
                      "seconds": round(time.monotonic() - started, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
