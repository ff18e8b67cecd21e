"""etcd's v3 JSON gateway, as ``EtcdRegistry`` speaks it: base64 keys and values in
JSON bodies, the paths they go to, error bodies with gRPC codes, and the messages of a
watch stream. The one module of the backend that knows that encoding: each request of
the registry is built here as a ``Call`` (its path and body), and ``GatewayRanges`` and
``GatewayAuth`` make the calls of ``transport`` with it, for ``pages`` and ``auth``.

Conventions handled here: keys and values are base64, int64 fields are
strings, and false/zero fields are omitted. Verified against etcd 3.4:

* ``/v3/lease/keepalive`` on an expired or unknown lease answers 200 with a
  result that has no ``TTL`` (i.e. 0).
* ``/v3/lease/revoke`` on an unknown lease answers 404, gRPC code 5.
* A watch stream first sends ``{"result": {"created": true}}``; a watch from
  a compacted revision then sends ``{"canceled": true, "compact_revision": N}``.

Every request asks for a member with a leader (``REQUIRE_LEADER``: the gateway passes
``Grpc-Metadata-Hasleader`` on as etcd's ``hasleader`` gRPC metadata, checked with etcd
3.4.23), so a member cut from the others answers "etcdserver: no leader" at once instead
of holding the request until its own request timeout (7 s). docs/operations.md, "etcd
cluster faults", says what each fault costs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.access_base import READ, Permission
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.bounds import kept_key, kept_value
from vnetd.registry.etcd.transport import (
    UNAVAILABLE_CODES,
    RangePage,
    RangeRequest,
    Refused,
    RegistryFull,
    no_space,
    prefix_end,
)

JSON = dict[str, Any]

REQUIRE_LEADER = {"Grpc-Metadata-Hasleader": "true"}
UNAVAILABLE_STATUS = 408
"""What a stopping member's gateway answers ("grpc: the client connection is closing",
HTTP 408, code 1): the member is going away, not refusing."""
ANSWER_PER_KEY = 100
"""Bytes of JSON an entry of a range answer takes beyond its base64 key and value."""


def b64(data: str | bytes) -> str:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def key_value(raw: JSON) -> KeyValue:
    return KeyValue(
        key=kept_key(unb64(raw["key"]).decode("utf-8", "surrogateescape")),
        value=kept_value(unb64(raw.get("value", ""))),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def error_message(data: object) -> tuple[str, int | None] | None:
    """(message, gRPC code) of a gateway error body, or None if it is not one."""
    if not isinstance(data, dict) or not data.get("error"):
        return None
    error = data["error"]
    if isinstance(error, dict):  # streaming endpoints: {"error": {"grpc_code", "message"}}
        return str(error.get("message", error)), error.get("grpc_code")
    return str(data.get("message") or error), data.get("code")


def check_response(response: httpx.Response, where: str) -> JSON:
    """The decoded body, or the matching ``RegistryError``."""
    try:
        data = response.json()
    except ValueError:
        data = None
    error = error_message(data)
    status = response.status_code
    if error is not None or status >= 400:
        message, code = error or (response.text[:200] or response.reason_phrase, None)
        text = f"etcd {where}: {message} (HTTP {status}, code {code})"
        if no_space(message, code):
            raise RegistryFull(text)  # HTTP 429, code 8: a retry passes once space is freed
        if status >= 500 or status == UNAVAILABLE_STATUS or code in UNAVAILABLE_CODES:
            raise RegistryUnavailable(text)
        raise Refused(text, code)
    if not isinstance(data, dict):
        raise RegistryError(f"etcd {where}: unusable response {response.text[:200]!r}")
    return data


def key_of(body: JSON) -> str:
    """The key a request body names, for error messages ("?" if none)."""
    raw = body.get("key")
    if not isinstance(raw, str):
        return "?"
    try:
        return unb64(raw).decode("utf-8", "replace")
    except ValueError:
        return "?"


Call = tuple[str, JSON]
"""One gateway request: its path and its body."""
WATCH = "/v3/watch"
AUTHENTICATE = "/v3/auth/authenticate"


def get_call(key: str) -> Call:
    return "/v3/kv/range", {"key": b64(key)}


def count_call(watched: JSON) -> Call:
    """A count of the keys a watch request (``watch_request``) covers."""
    query = {"key": watched.get("key", ""), "range_end": watched.get("range_end", "")}
    return "/v3/kv/range", {**query, "count_only": True}


def _put_if(compare: JSON, key: str, value: bytes, lease: int) -> Call:
    """A put of ``key`` if ``compare`` holds, else a read of it."""
    put = {"key": b64(key), "value": b64(value), "lease": str(lease)}
    body = {
        "compare": [compare],
        "success": [{"request_put": put}],
        "failure": [{"request_range": {"key": b64(key)}}],
    }
    return "/v3/kv/txn", body


def create_call(key: str, value: bytes, lease: int) -> Call:
    compare = {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
    return _put_if(compare, key, value, lease)


def replace_call(key: str, value: bytes, mod_revision: int, lease: int) -> Call:
    compare = {
        "key": b64(key),
        "target": "MOD",
        "result": "EQUAL",
        "mod_revision": str(mod_revision),
    }
    return _put_if(compare, key, value, lease)


def create_all_call(items: Mapping[str, bytes]) -> Call:
    body = {
        "compare": [
            {"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
            for k in items
        ],
        "success": [{"request_put": {"key": b64(k), "value": b64(v)}} for k, v in items.items()],
    }
    return "/v3/kv/txn", body


def delete_call(key: str) -> Call:
    return "/v3/kv/deleterange", {"key": b64(key)}


def grant_call(ttl: int) -> Call:
    return "/v3/lease/grant", {"TTL": str(ttl)}


def keepalive_call(lease: int) -> Call:
    return "/v3/lease/keepalive", {"ID": str(lease)}


def revoke_call(lease: int) -> Call:
    return "/v3/lease/revoke", {"ID": str(lease)}


def watch_request(prefix: str) -> JSON:
    """A watch's ``create_request`` for the keys under ``prefix``, without its start."""
    return {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}


def first_entry(data: JSON) -> KeyValue | None:
    """The entry a ``get_call`` answered, or None."""
    kvs = data.get("kvs", [])
    return key_value(kvs[0]) if kvs else None


def existing_entry(data: JSON) -> KeyValue | None:
    """The entry the read of a ``create_call`` that failed found, or None."""
    for response in data.get("responses", []):
        kvs = response.get("response_range", {}).get("kvs", [])
        if kvs:
            return key_value(kvs[0])
    return None


def range_body(request: RangeRequest) -> JSON:
    body: JSON = {
        "key": b64(request.start),
        "range_end": b64(request.end),
        "limit": str(request.limit),
    }
    if request.revision:
        body["revision"] = str(request.revision)
    return body


def range_page(data: JSON) -> RangePage:
    """A ``/v3/kv/range`` answer; its size counts each entry's base64 key and value and
    ``ANSWER_PER_KEY``."""
    kvs = data.get("kvs", [])
    return RangePage(
        kvs=[key_value(raw) for raw in kvs],
        revision=int(data["header"]["revision"]),
        more=bool(data.get("more", False)),
        last_key=unb64(kvs[-1]["key"]) if kvs else b"",
        size=sum(len(raw.get("key", "")) + len(raw.get("value", "")) + ANSWER_PER_KEY
                 for raw in kvs),
    )  # fmt: skip


BoundedPost = Callable[[str, JSON, int, float], Awaitable[JSON]]
"""One gateway call: its path, its body, the byte bound of its answer and the time added
to its usual bound (``EtcdRegistry._post``)."""


class GatewayRanges:
    """``transport.RangeReader`` as ``/v3/kv/range`` calls on ``post``."""

    def __init__(self, post: BoundedPost) -> None:
        self._post = post

    async def range_page(self, request: RangeRequest, cap: int, extra: float) -> RangePage:
        return range_page(await self._post("/v3/kv/range", range_body(request), cap, extra))


def permission_range(permission: Permission) -> JSON:
    body: JSON = {"key": b64(permission.key)}
    if permission.prefix:
        body["range_end"] = b64(prefix_end(permission.key))
    return body


def permission_of(raw: JSON) -> Permission:
    """A permission as etcd reports it; a range is ours only if it is a prefix's."""
    key = unb64(raw.get("key", "")).decode("utf-8", "surrogateescape")
    end = unb64(raw.get("range_end", ""))
    kind = str(raw.get("permType", READ))
    return Permission(kind, key, prefix=bool(end) and end == prefix_end(key))


class GatewayAuth:
    """``transport.AuthCalls`` as ``/v3/auth/*`` calls on ``call`` (``EtcdRegistry.call``)."""

    def __init__(self, call: Callable[[str, JSON], Awaitable[JSON]]) -> None:
        self._call = call

    async def add_role(self, name: str) -> None:
        await self._call("/v3/auth/role/add", {"name": name})

    async def role_permissions(self, role: str) -> set[Permission]:
        answer = await self._call("/v3/auth/role/get", {"role": role})
        return {permission_of(raw) for raw in answer.get("perm", [])}

    async def grant_permission(self, role: str, permission: Permission) -> None:
        perm = {"permType": permission.kind, **permission_range(permission)}
        await self._call("/v3/auth/role/grant", {"name": role, "perm": perm})

    async def revoke_permission(self, role: str, permission: Permission) -> None:
        await self._call("/v3/auth/role/revoke", {"role": role, **permission_range(permission)})

    async def user_roles(self, name: str) -> set[str]:
        answer = await self._call("/v3/auth/user/get", {"name": name})
        return {str(role) for role in answer.get("roles", [])}

    async def add_user(self, name: str, password: str) -> None:
        await self._call("/v3/auth/user/add", {"name": name, "password": password})

    async def grant_role(self, user: str, role: str) -> None:
        await self._call("/v3/auth/user/grant", {"user": user, "role": role})

    async def revoke_role(self, user: str, role: str) -> None:
        await self._call("/v3/auth/user/revoke", {"name": user, "role": role})

    async def enable_auth(self) -> None:
        await self._call("/v3/auth/enable", {})


WATCH_MESSAGE_BYTES = 16 * 1024 * 1024
"""The longest watch message read (docs/architecture.md, "Bounded reads"). etcd sends a
watcher that resumes from an older revision up to 1000 revisions in one message,
which junk values could make hundreds of MiB; a longer message ends the watch, and
the consumer lists again (in bounded pages) and watches from after it."""


async def capped_lines(
    chunks: AsyncIterator[bytes], cap: int = WATCH_MESSAGE_BYTES
) -> AsyncIterator[str]:
    """The lines of a stream, each at most ``cap`` bytes.

    Raises:
        RegistryUnavailable: a line ran over ``cap`` (it is not read further).
    """
    pending = bytearray()
    scanned = 0  # bytes of ``pending`` known to hold no newline: each byte is searched once
    async for chunk in chunks:
        pending += chunk
        while (end := pending.find(b"\n", scanned)) >= 0:
            with memoryview(pending) as view:  # decoded in place: one copy of a long line
                line = str(view[:end], "utf-8", "replace")
            del pending[: end + 1]
            scanned = 0
            yield line
        scanned = len(pending)
        if len(pending) > cap:
            raise RegistryUnavailable(
                f"etcd watch: a message over {cap // 2**20} MiB (junk values under the "
                "prefix?); listing again"
            )
    if pending:
        yield pending.decode("utf-8", "replace")


def _event_hook(obj: JSON) -> JSON | WatchEvent:
    """Each watch event as its ``WatchEvent`` as soon as it is decoded: a message that
    catches a watcher up holds up to 1000 revisions (2.7 MB of junk keys measured), whose
    dicts decoded whole cost several times its size at once, and the Python heap keeps
    what it grew to (``tests/e2e/test_junk_flood.py``)."""
    kv = obj.get("kv")
    if isinstance(kv, dict) and isinstance(kv.get("key"), str) and len(obj) <= 3:
        return watch_event(obj)
    return obj


_decode_message = json.JSONDecoder(object_hook=_event_hook).decode


async def next_message(lines: AsyncIterator[str]) -> JSON:
    """The next watch ``result`` on the stream (its events already ``WatchEvent``);
    errors and stream end raise."""
    async for line in lines:
        if not line.strip():
            continue
        try:
            data = _decode_message(line)
        except ValueError as exc:
            raise RegistryError(f"etcd watch: unusable message {line[:200]!r}") from exc
        error = error_message(data)
        if error is not None:
            raise RegistryUnavailable(f"etcd watch: {error[0]} (code {error[1]})")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, dict):
            raise RegistryError(f"etcd watch: unusable message {line[:200]!r}")
        return result
    raise RegistryUnavailable("etcd watch: stream ended")


def raise_for_watch(result: JSON) -> None:
    if int(result.get("compact_revision", 0)) > 0:
        raise WatchCompacted(int(result["compact_revision"]))
    if result.get("canceled", False):
        reason = result.get("cancel_reason", "no reason given")
        raise RegistryUnavailable(f"etcd watch canceled: {reason}")


async def watch_events(lines: AsyncIterator[str]) -> AsyncGenerator[list[WatchEvent], None]:
    """The events of each watch message, as one batch (messages without events are skipped)."""
    while True:
        try:
            result = await next_message(lines)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise RegistryUnavailable(f"etcd watch: stream broke: {exc!r}") from exc
        raise_for_watch(result)
        batch = [
            event if isinstance(event, WatchEvent) else watch_event(event)
            for event in result.get("events", [])
        ]
        if batch:
            yield batch


def watch_event(event: JSON) -> WatchEvent:
    kv = event["kv"]
    return WatchEvent(
        kind="delete" if event.get("type") == "DELETE" else "put",
        key=kept_key(unb64(kv["key"]).decode("utf-8", "surrogateescape")),
        value=kept_value(unb64(kv.get("value", ""))),
        mod_revision=int(kv.get("mod_revision", 0)),
        create_revision=int(kv.get("create_revision", 0)),
        lease=int(kv.get("lease", 0)),
    )
