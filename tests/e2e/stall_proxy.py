"""An HTTP proxy to etcd's JSON gateway that can hold a paged list after its first page.

Run inside a pod: ``python stall_proxy.py PORT UPSTREAM CONTROL_DIR PREFIX``. It
listens on 127.0.0.1:PORT and forwards every request to UPSTREAM (etcd's client
URL), streaming answers back (watches included). While ``CONTROL_DIR/stall``
exists it closes every watch stream (so the daemon behind it lists again) and
holds, unanswered, every ``/v3/kv/range`` that ends where PREFIX's range ends and
carries a ``revision`` (a list's pages after its first), until the file is gone;
each held request is counted in ``CONTROL_DIR/held`` (one line each). Written by
hand with h11 and httpx (both already dependencies): no proxy on this machine can
hold requests by what their JSON body says.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import h11
import httpx
import trio

POLL = 0.05
READ = 65536


def stalled(control: Path) -> bool:
    return (control / "stall").exists()


async def receive(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event | type:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(READ))


async def close_when_stalled(control: Path, scope: trio.CancelScope) -> None:
    while not stalled(control):
        await trio.sleep(POLL)
    scope.cancel()


async def serve(stream: trio.SocketStream, upstream: str, control: Path, end: str) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream, httpx.AsyncClient(base_url=upstream, timeout=None) as client:
        while True:
            request = await receive(conn, stream)
            if not isinstance(request, h11.Request):
                return
            body = b""
            while not isinstance(event := await receive(conn, stream), h11.EndOfMessage):
                if isinstance(event, h11.Data):
                    body += event.data
            path = request.target.decode()
            if path == "/v3/watch" and stalled(control):
                return  # the daemon lists again
            if path == "/v3/kv/range" and stalled(control):
                asked = json.loads(body or b"{}")
                if asked.get("range_end") == end and "revision" in asked:
                    with (control / "held").open("a") as held:
                        held.write(f"{asked['revision']}\n")
                    while stalled(control):
                        await trio.sleep(POLL)
            headers = {k.decode(): v.decode() for k, v in request.headers
                       if k.lower() in (b"content-type", b"authorization")}  # fmt: skip
            headers["accept-encoding"] = "identity"
            async with client.stream(request.method.decode(), path, content=body,
                                     headers=headers) as answer:  # fmt: skip
                kind = answer.headers.get("content-type", "application/json")
                await stream.send_all(conn.send(h11.Response(
                    status_code=answer.status_code,
                    headers=[("content-type", kind), ("transfer-encoding", "chunked")],
                )))  # fmt: skip
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        if path == "/v3/watch":
                            nursery.start_soon(close_when_stalled, control, scope)
                        async for chunk in answer.aiter_raw():
                            await stream.send_all(conn.send(h11.Data(data=chunk)))
                        nursery.cancel_scope.cancel()
                if scope.cancelled_caught:
                    return  # a watch cut: the connection goes with it
            await stream.send_all(conn.send(h11.EndOfMessage()))
            conn.start_next_cycle()


async def main() -> None:
    port, upstream, control, prefix = sys.argv[1:5]
    # The end of the prefix's key range, as etcd's range_end: its last byte plus one.
    end = base64.b64encode(prefix[:-1].encode() + bytes([ord(prefix[-1]) + 1])).decode()

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await serve(stream, upstream, Path(control), end)
        except Exception as exc:  # one connection's end, alone or in a group: never the proxy's
            # The client went away (a timed-out page, a watch it closed) or etcd did.
            print(f"connection ended: {exc!r}", file=sys.stderr, flush=True)

    listeners = await trio.open_tcp_listeners(int(port), host="127.0.0.1")
    print("listening", flush=True)
    await trio.serve_listeners(handler, listeners)


if __name__ == "__main__":
    trio.run(main)
