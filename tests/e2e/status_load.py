"""Loop GET requests on one URL from many clients for a while:
``python status_load.py URL CLIENTS SECONDS``. Prints one JSON line:
{"requests": N, "failed": F, "slowest": S, "ranks": R} (R: rows in the first JSON
answer's "ranks", or -1). Run inside a lab pod."""

from __future__ import annotations

import json
import sys
import time

import httpx
import trio


async def main() -> None:
    url, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    done = failed = 0
    slowest = 0.0
    ranks = -1
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done, failed, slowest, ranks
        async with httpx.AsyncClient(timeout=10) as http:
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    response = await http.get(url)
                    ok = response.status_code == 200
                    if ok and ranks < 0:
                        ranks = len(response.json()["ranks"])
                except httpx.HTTPError:
                    ok = False
                slowest = max(slowest, time.monotonic() - started)
                done += ok
                failed += not ok

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    print(json.dumps({"requests": done, "failed": failed, "slowest": round(slowest, 3),
                      "ranks": ranks}))  # fmt: skip


if __name__ == "__main__":
    trio.run(main)
