"""The relay's HTTP side: the part of etcd's v3 JSON gateway a daemon reads members with.

Served (everything else answers 501, so a client moves on to its next endpoint):

* ``POST /v3/kv/range`` on keys under the relay's prefix: a page (``limit``, and
  ``revision`` for the pages after the first, ``registry.etcd.pages``) or a count
  (``count_only``, the watch's quiet check); a revision no longer kept answers etcd's
  "compacted" (code 11), and the list starts over from its first page.
* ``POST /v3/watch`` on the prefix itself, from a start revision: etcd's
  ``created`` message, then the window's events since the start, up to
  ``BATCH_REVISIONS`` revisions a message as etcd sends a watcher that resumes, then
  each new batch as the relay takes it, and a progress notification every
  ``progress_every`` s when asked (``progress_notify``). A start older than the
  window, or a watch open when the relay lists again, gets etcd's compacted answer
  (the daemon lists again, from the relay); a relay that lost etcd ends its watches
  with etcd's "unavailable" error (code 14), which moves the daemon's watch to its
  next endpoint from the revision after its last event, and answers 503 until it
  has listed again.
* ``GET /healthz``: 200 while in step with etcd, else 503; ``GET /metrics``: its figures.

Records go out as the registry read them: keys and values in base64 of the same bytes,
so etcd's own base64 text for every value under the read bound (``registry.bounds``).

HTTP by hypercorn's trio worker, as the daemon's own endpoint (``observe.http``): a
well-kept ASGI server that runs on trio and streams a response (a watch is one long
chunked answer); the routes are four fixed paths and need no framework.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

import trio

from vnetd.asgi import Receive, Scope, Send, lifespan, respond
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.etcd.transport import prefix_end as prefix_end_bytes
from vnetd.registry.relay.cache import WINDOW_EVENTS, MemberCache

log = logging.getLogger("vnetd.relay")

JSON = dict[str, Any]

BATCH_REVISIONS = 1000
"""Revisions of one watch message to a watcher behind the relay, as etcd sends."""
REQUEST_BYTES = 64 * 1024
"""The longest request body read; a read request is a few hundred bytes."""
PROGRESS_EVERY = 5.0
"""Seconds between progress notifications on a quiet watch that asks for them: the
daemon's quiet check then needs no read (``registry.etcd.watch``)."""
STORE_WAIT = 2.0
"""The most a watch from after the relay's revision waits for the store's revision."""
GRACEFUL_TIMEOUT = 1.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUT_OF_RANGE = 11
UNAVAILABLE = 14
UNIMPLEMENTED = 12


class Changes:
    """Wakes every watch when the cache changed (a batch, a list, a lost watch)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Until the next change."""
        await self._event.wait()


def prefix_end(prefix: str) -> str:
    return prefix_end_bytes(prefix).decode("utf-8", "surrogateescape")


def b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


def unb64_key(raw: object) -> str:
    if not isinstance(raw, str):
        return ""
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8", "surrogateescape")
    except ValueError:
        return ""


def kv_json(kv: KeyValue) -> JSON:
    """An entry as etcd's gateway writes it (zero fields left out, int64 as strings)."""
    raw: JSON = {
        "key": b64(kv.key),
        "create_revision": str(kv.create_revision),
        "mod_revision": str(kv.mod_revision),
    }
    if kv.value:
        raw["value"] = base64.b64encode(kv.value).decode("ascii")
    if kv.lease:
        raw["lease"] = str(kv.lease)
    return raw


@lru_cache(maxsize=WINDOW_EVENTS)
def event_text(event: WatchEvent) -> str:
    """An event's JSON, made once however many watchers it goes to."""
    if event.kind == "delete":
        kv = {"key": b64(event.key), "mod_revision": str(event.mod_revision)}
        return json.dumps({"type": "DELETE", "kv": kv}, separators=(",", ":"))
    put = KeyValue(event.key, event.value, event.create_revision, event.mod_revision, event.lease)
    return json.dumps({"kv": kv_json(put)}, separators=(",", ":"))


def _header(revision: int) -> str:
    return f'{{"revision":"{revision}"}}'


def events_messages(events: list[WatchEvent], revision: int) -> list[bytes]:
    """Watch messages of ``events``, each of at most ``BATCH_REVISIONS`` revisions (one
    revision is never split)."""
    messages: list[bytes] = []
    start = 0
    while start < len(events):
        end, revisions, last = start, 0, -1
        while end < len(events):
            if events[end].mod_revision != last:
                if revisions == BATCH_REVISIONS:
                    break
                revisions, last = revisions + 1, events[end].mod_revision
            end += 1
        texts = ",".join(event_text(event) for event in events[start:end])
        line = f'{{"result":{{"header":{_header(revision)},"events":[{texts}]}}}}\n'
        messages.append(line.encode())
        start = end
    return messages


def _result(revision: int, **fields: Any) -> bytes:  # noqa: ANN401 - JSON fields
    result = {"header": {"revision": str(revision)}, **fields}
    return (json.dumps({"result": result}, separators=(",", ":")) + "\n").encode()


def _error_line(code: int, message: str) -> bytes:
    error = {"grpc_code": code, "http_code": 503, "message": message, "http_status": "Unavailable"}
    return (json.dumps({"error": error}) + "\n").encode()


class RelayApp:
    """The ASGI application over a ``MemberCache``.

    Args:
        cache: what is served; ``changes`` is notified of every change to it.
        store_revision: etcd's current revision (one read), for a watch from after the
            relay's revision: a daemon that read etcd directly may have seen revisions
            of other keys.
        progress_every: seconds between progress notifications on a quiet watch.
    """

    def __init__(
        self,
        cache: MemberCache,
        changes: Changes,
        store_revision: Callable[[], Awaitable[int]],
        progress_every: float = PROGRESS_EVERY,
    ) -> None:
        self.cache = cache
        self.changes = changes
        self._store_revision = store_revision
        self._progress_every = progress_every
        self.watchers = 0
        """Watches being served now."""
        self.sent_events = 0
        """Events sent, summed over the watches."""
        self.bound: list[str] = []
        """The addresses served (``service.run_relay``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/metrics" and method == "GET":
            await respond(send, 200, self.metrics(), content_type=METRICS_CONTENT_TYPE)
            return
        if path == "/healthz" and method == "GET":
            ok = self.cache.synced
            text = b"in step with etcd\n" if ok else b"not in step with etcd\n"
            await respond(send, 200 if ok else 503, text)
            return
        if method != "POST" or path not in ("/v3/kv/range", "/v3/watch"):
            await _error(
                send, 501, UNIMPLEMENTED, f"vnetd relay: serves only reads of {self.cache.prefix}"
            )
            return
        body = await _read_body(receive)
        if body is None:
            await _error(send, 400, 3, "vnetd relay: unusable request body")
            return
        if not self.cache.synced:
            await _error(send, 503, UNAVAILABLE, "vnetd relay: not in step with etcd")
            return
        if path == "/v3/kv/range":
            await self._range(body, send)
        else:
            await self._watch(body, receive, send)

    def metrics(self) -> bytes:
        """Prometheus text: what the relay holds and serves (five figures, written here:
        prometheus-client's registry is the daemon's, in ``observe``)."""
        cache = self.cache
        rows = [
            ("vnetd_relay_synced", "gauge", "1 while in step with etcd", int(cache.synced)),
            ("vnetd_relay_members", "gauge", "entries under the prefix", len(cache.members)),
            ("vnetd_relay_revision", "gauge", "revision the relay is current at", cache.revision),
            ("vnetd_relay_watchers", "gauge", "watches served now", self.watchers),
            ("vnetd_relay_events_sent_total", "counter", "events sent", self.sent_events),
        ]
        text = "".join(
            f"# HELP {name} {about}\n# TYPE {name} {kind}\n{name} {value}\n"
            for name, kind, about, value in rows
        )
        return text.encode()

    def _covered(self, start: str, end: str) -> bool:
        prefix = self.cache.prefix
        if not start.startswith(prefix):
            return False
        return not end or end <= prefix_end(prefix)

    async def _range(self, body: JSON, send: Send) -> None:
        start, end = unb64_key(body.get("key")), unb64_key(body.get("range_end"))
        if not self._covered(start, end):
            await _error(send, 501, UNIMPLEMENTED, f"vnetd relay: serves only {self.cache.prefix}")
            return
        try:
            limit, revision = int(body.get("limit", 0)), int(body.get("revision", 0))
        except (TypeError, ValueError):
            await _error(send, 400, 3, "vnetd relay: limit and revision must be integers")
            return
        page = self.cache.page(start, end, limit, revision)
        if page is None:
            message = "etcdserver: mvcc: required revision has been compacted"
            await _error(send, 400, OUT_OF_RANGE, message)
            return
        answer: JSON = {"header": {"revision": str(page.revision)}, "count": str(page.count)}
        if not body.get("count_only"):
            answer["kvs"] = [kv_json(kv) for kv in page.kvs]
            answer["more"] = page.more
        await respond(send, 200, json.dumps(answer).encode(), content_type="application/json")

    async def _watch(self, body: JSON, receive: Receive, send: Send) -> None:
        create = body.get("create_request")
        if not isinstance(create, dict):
            await _error(send, 501, UNIMPLEMENTED, "vnetd relay: a watch takes a create_request")
            return
        prefix = self.cache.prefix
        key, end = unb64_key(create.get("key")), unb64_key(create.get("range_end"))
        if key != prefix or end != prefix_end(prefix):
            await _error(send, 501, UNIMPLEMENTED, f"vnetd relay: watches only {prefix}")
            return
        try:
            start = int(create.get("start_revision", 0)) or self.cache.revision + 1
        except (TypeError, ValueError):
            await _error(send, 400, 3, "vnetd relay: start_revision must be an integer")
            return
        header = self.cache.revision
        if start > header + 1:
            with trio.move_on_after(STORE_WAIT):
                header = max(header, await self._store_revision())
        start_message = {"type": "http.response.start", "status": 200}
        start_message["headers"] = [(b"content-type", b"application/json")]
        await send(start_message)
        await _send_line(send, _result(header, created=True))
        self.watchers += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                await self._stream(send, start, bool(create.get("progress_notify")))
                nursery.cancel_scope.cancel()
        finally:
            self.watchers -= 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, send: Send, start: int, progress: bool) -> None:
        """The events from ``start`` on, until the relay relists or loses etcd."""
        cache, epoch, after = self.cache, self.cache.epoch, start
        while True:
            if not cache.synced:
                await _send_line(send, _error_line(UNAVAILABLE, "vnetd relay: lost etcd"))
                return
            events = cache.events_since(after) if cache.epoch == epoch else None
            if events is None:
                compacted = {"canceled": True, "compact_revision": str(cache.floor + 1)}
                await _send_line(send, _result(cache.revision, **compacted))
                return
            if events:
                for message in events_messages(events, cache.revision):
                    await _send_line(send, message)
                self.sent_events += len(events)
                after = events[-1].mod_revision + 1
                continue
            with trio.move_on_after(self._progress_every) as quiet:
                await self.changes.wait()
            if quiet.cancelled_caught and progress:
                await _send_line(send, _result(cache.revision))


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _send_line(send: Send, line: bytes) -> None:
    await send({"type": "http.response.body", "body": line, "more_body": True})


async def _read_body(receive: Receive) -> JSON | None:
    data = bytearray()
    while True:
        message = await receive()
        data += message.get("body", b"")
        if len(data) > REQUEST_BYTES:
            return None
        if not message.get("more_body", False):
            break
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def _error(send: Send, status: int, code: int, message: str) -> None:
    body = {"error": message, "code": code, "message": message}
    await respond(send, status, json.dumps(body).encode(), content_type="application/json")


async def serve_relay(
    listen: list[str],
    app: RelayApp,
    tls: ssl.SSLContext | None = None,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` (``host:port`` each; port 0 picks one) until cancelled,
    over HTTPS with ``tls`` (``relay.tls.server_context``), else plain HTTP;
    ``task_status.started`` receives the bound addresses.

    Raises:
        OSError: an address cannot be bound.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    class ServerConfig(Config):
        """hypercorn's settings, serving with ``tls`` as it is: the relay loads a renewed
        certificate into that context (``relay.tls.keep_loaded``), where hypercorn would
        build its own once from file names."""

        @property
        def ssl_enabled(self) -> bool:
            return tls is not None

        def create_ssl_context(self) -> ssl.SSLContext | None:
            return tls

    config = ServerConfig()
    config.bind = listen
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.keep_alive_timeout = 75.0
    await serve(app, config, mode="asgi", task_status=task_status)  # type: ignore[arg-type]
