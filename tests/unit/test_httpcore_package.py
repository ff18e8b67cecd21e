"""httpcore imported without anyio and h2 (``vnetd.registry.etcd.httpcore_package``): a
client under trio still talks HTTP/1.1, and both import as usual afterwards."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import trio
from functools import partial
from vnetd.registry.etcd.httpcore_package import import_httpcore
import_httpcore()
import httpx

async def serve(stream):
    await stream.receive_some(65536)
    await stream.send_all(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok")
    await stream.aclose()

async def main():
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with httpx.AsyncClient(verify=False, timeout=5) as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()
    return response.text

text = trio.run(main)
skipped = [name for name in ("anyio", "h2") if name in sys.modules]
import anyio, h2.connection  # the marks are gone
print(skipped, text, bool(anyio.__name__), bool(h2.connection.__name__))
"""


def test_a_trio_client_without_anyio_and_h2():
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["[]", "ok", "True", "True"]
