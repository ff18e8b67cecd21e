"""``EtcdRegistry``: the ``Registry`` protocol over etcd's v3 JSON gateway.

Hand-written on purpose: python-etcd3 no longer imports with current
protobuf releases, and the gateway (``POST /v3/...`` with JSON bodies) needs
nothing but httpx. Gateway conventions handled here: keys and values are
base64, int64 fields are strings, and false/zero fields are omitted.

Behaviour verified against etcd 3.4:

* ``/v3/lease/keepalive`` on an expired or unknown lease answers 200 with a
  result that has no ``TTL`` (i.e. 0).
* ``/v3/lease/revoke`` on an unknown lease answers 404, gRPC code 5.
* A watch stream first sends ``{"result": {"created": true}}``; a watch from
  a compacted revision then sends ``{"canceled": true, "compact_revision": N}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import trio

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.base import KeyValue, WatchEvent

JSON = dict[str, Any]

# gRPC status codes the gateway reports in error bodies.
_NOT_FOUND = 5
_UNAVAILABLE_CODES = frozenset({4, 14})  # DEADLINE_EXCEEDED, UNAVAILABLE


def _b64(data: str | bytes) -> str:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: str) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    raw = bytearray(prefix.encode("utf-8", "surrogateescape"))
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"  # every key
    raw[-1] += 1
    return bytes(raw)


def _key_value(raw: JSON) -> KeyValue:
    return KeyValue(
        key=_unb64(raw["key"]).decode("utf-8", "surrogateescape"),
        value=_unb64(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _error_message(data: object) -> tuple[str, int | None] | None:
    """(message, gRPC code) of a gateway error body, or None if it is not one."""
    if not isinstance(data, dict) or not data.get("error"):
        return None
    error = data["error"]
    if isinstance(error, dict):  # streaming endpoints: {"error": {"grpc_code", "message"}}
        return str(error.get("message", error)), error.get("grpc_code")
    return str(data.get("message") or error), data.get("code")


def _check(response: httpx.Response, where: str) -> JSON:
    """The decoded body, or the matching ``RegistryError``."""
    try:
        data = response.json()
    except ValueError:
        data = None
    error = _error_message(data)
    status = response.status_code
    if error is not None or status >= 400:
        message, code = error or (response.text[:200] or response.reason_phrase, None)
        text = f"etcd {where}: {message} (HTTP {status}, code {code})"
        if status >= 500 or code in _UNAVAILABLE_CODES:
            raise RegistryUnavailable(text)
        raise _Refused(text, code)
    if not isinstance(data, dict):
        raise RegistryError(f"etcd {where}: unusable response {response.text[:200]!r}")
    return data


class _Refused(RegistryError):
    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class EtcdRegistry:
    """A ``Registry`` backed by one etcd cluster through its JSON gateway.

    Args:
        endpoints: client URLs such as ``http://10.0.0.1:2379``; on a
            connection error or timeout the next one is tried, each once.
        timeout: the bound of each call (and of connecting a watch), seconds.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 5.0) -> None:
        if not endpoints:
            raise RegistryError("etcd endpoints: at least one URL is required")
        self._endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._current = 0
        self._timeout = timeout
        self._client = httpx.AsyncClient(timeout=timeout)

    async def _post(self, path: str, body: JSON) -> JSON:
        failures: list[str] = []
        for endpoint in self._rotation():
            where = f"{endpoint}{path}"
            with trio.move_on_after(self._timeout):
                try:
                    response = await self._client.post(where, json=body)
                    data = _check(response, where)
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    failures.append(f"{endpoint}: {exc!r}")
                    continue
                self._current = self._endpoints.index(endpoint)
                return data
            failures.append(f"{endpoint}: no answer within {self._timeout} s")
        raise RegistryUnavailable(f"etcd {path} failed on every endpoint: {'; '.join(failures)}")

    def _rotation(self) -> list[str]:
        n = len(self._endpoints)
        return [self._endpoints[(self._current + i) % n] for i in range(n)]

    async def get(self, key: str) -> KeyValue | None:
        data = await self._post("/v3/kv/range", {"key": _b64(key)})
        kvs = data.get("kvs", [])
        return _key_value(kvs[0]) if kvs else None

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        data = await self._post("/v3/kv/range", body)
        kvs = sorted(_key_value(raw) for raw in data.get("kvs", []))
        return kvs, int(data["header"]["revision"])

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        data = await self._txn(compare, key, value, lease)
        if data.get("succeeded", False):
            return None
        for response in data.get("responses", []):
            kvs = response.get("response_range", {}).get("kvs", [])
            if kvs:
                return _key_value(kvs[0])
        raise RegistryError(f"etcd create {key!r}: key exists but could not be read")

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        compare = {
            "key": _b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }
        data = await self._txn(compare, key, value, lease)
        return bool(data.get("succeeded", False))

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        if not items:
            return True
        body = {
            "compare": [
                {"key": _b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                for k in items
            ],
            "success": [
                {"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in items.items()
            ],
        }
        data = await self._post("/v3/kv/txn", body)
        return bool(data.get("succeeded", False))

    async def _txn(self, compare: JSON, key: str, value: bytes, lease: int) -> JSON:
        put = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        body = {
            "compare": [compare],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(key)}}],
        }
        return await self._post("/v3/kv/txn", body)

    async def delete(self, key: str) -> bool:
        data = await self._post("/v3/kv/deleterange", {"key": _b64(key)})
        return int(data.get("deleted", 0)) > 0

    async def grant(self, ttl: int) -> int:
        data = await self._post("/v3/lease/grant", {"TTL": str(ttl)})
        return int(data["ID"])

    async def keepalive(self, lease: int) -> int:
        data = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(data.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except _Refused as exc:
            if exc.code != _NOT_FOUND:
                raise

    def watch(
        self, prefix: str, start_revision: int
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(prefix, start_revision)

    @asynccontextmanager
    async def _watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        request = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "start_revision": str(start_revision),
        }
        async with AsyncExitStack() as stack:
            lines = await self._open_watch(stack, {"create_request": request})
            events = _watch_events(lines)
            stack.push_async_callback(events.aclose)
            yield events

    async def _open_watch(self, stack: AsyncExitStack, body: JSON) -> AsyncIterator[str]:
        """Open the stream on the first endpoint that confirms the watch."""
        timeout = httpx.Timeout(self._timeout, read=None)
        failures: list[str] = []
        for endpoint in self._rotation():
            where = f"{endpoint}/v3/watch"
            attempt = AsyncExitStack()
            with trio.move_on_after(self._timeout):
                try:
                    response = await attempt.enter_async_context(
                        self._client.stream("POST", where, json=body, timeout=timeout)
                    )
                    if response.status_code >= 400:
                        await response.aread()
                        _check(response, where)
                    lines = response.aiter_lines()
                    first = await _next_message(lines)
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    await attempt.aclose()
                    failures.append(f"{endpoint}: {exc!r}")
                    continue
                except BaseException:
                    await attempt.aclose()
                    raise
                self._current = self._endpoints.index(endpoint)
                stack.push_async_callback(attempt.aclose)
                if not first.get("created", False):
                    _raise_for_watch(first)
                return lines
            await attempt.aclose()
            failures.append(f"{endpoint}: no watch confirmation within {self._timeout} s")
        raise RegistryUnavailable(f"etcd watch failed on every endpoint: {'; '.join(failures)}")

    async def aclose(self) -> None:
        await self._client.aclose()


async def _next_message(lines: AsyncIterator[str]) -> JSON:
    """The next watch ``result`` on the stream; errors and stream end raise."""
    async for line in lines:
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise RegistryError(f"etcd watch: unusable message {line[:200]!r}") from exc
        error = _error_message(data)
        if error is not None:
            raise RegistryUnavailable(f"etcd watch: {error[0]} (code {error[1]})")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, dict):
            raise RegistryError(f"etcd watch: unusable message {line[:200]!r}")
        return result
    raise RegistryUnavailable("etcd watch: stream ended")


def _raise_for_watch(result: JSON) -> None:
    if int(result.get("compact_revision", 0)) > 0:
        raise WatchCompacted(int(result["compact_revision"]))
    if result.get("canceled", False):
        reason = result.get("cancel_reason", "no reason given")
        raise RegistryUnavailable(f"etcd watch canceled: {reason}")


async def _watch_events(lines: AsyncIterator[str]) -> AsyncGenerator[WatchEvent, None]:
    while True:
        try:
            result = await _next_message(lines)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise RegistryUnavailable(f"etcd watch: stream broke: {exc!r}") from exc
        _raise_for_watch(result)
        for event in result.get("events", []):
            kv = event["kv"]
            yield WatchEvent(
                kind="delete" if event.get("type") == "DELETE" else "put",
                key=_unb64(kv["key"]).decode("utf-8", "surrogateescape"),
                value=_unb64(kv.get("value", "")),
                mod_revision=int(kv.get("mod_revision", 0)),
                create_revision=int(kv.get("create_revision", 0)),
            )


@asynccontextmanager
async def open_etcd_registry(endpoints: Sequence[str]) -> AsyncIterator[EtcdRegistry]:
    """An ``EtcdRegistry`` that is closed (shielded from cancellation) on exit."""
    registry = EtcdRegistry(endpoints)
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True):
            await registry.aclose()
