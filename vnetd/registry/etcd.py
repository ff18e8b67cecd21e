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

Security (``EtcdSecurity``): TLS with a CA file and a client certificate,
and etcd's username/password auth: ``POST /v3/auth/authenticate`` gives a
token that goes in the ``Authorization`` header of every call; when etcd
answers that the token is invalid (it expired, or another member issued
it: etcd's simple tokens are per member) the client authenticates again
and retries once. Credential problems (a certificate that does not verify,
a wrong password, a permission denied) raise ``RegistryAccessError``, one
line that names the flag to fix. It is a ``RegistryUnavailable``: the
daemon keeps its data plane and retries (a certificate may be renewed, a
role granted), the CLI prints the line and exits 2.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.base import KeyValue, WatchEvent

JSON = dict[str, Any]

# gRPC status codes the gateway reports in error bodies.
_NOT_FOUND = 5
_INVALID_ARGUMENT = 3
_PERMISSION_DENIED = 7
_UNAUTHENTICATED = 16
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


class RegistryAccessError(RegistryUnavailable):
    """etcd refused our credentials: TLS verification, authentication or a permission."""


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach a secured etcd: TLS files and a user. The password is never shown."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The client's TLS context: the CA (else the system's) and our certificate.

        Raises:
            RegistryError: a file cannot be read or is not PEM of the right kind.
        """
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(
                f"--etcd-ca (registry.ca_file) {self.ca_file}: not a readable PEM CA "
                f"certificate: {_reason(exc)}"
            ) from None
        if self.cert_file or self.key_file:
            if not (self.cert_file and self.key_file):
                raise RegistryError(
                    "--etcd-cert and --etcd-key (registry.cert_file, registry.key_file): "
                    "give both or neither"
                )
            _check_not_expired(self.cert_file)
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except (OSError, ssl.SSLError) as exc:
                raise RegistryError(
                    f"--etcd-cert {self.cert_file} / --etcd-key {self.key_file}: cannot load "
                    f"the client certificate and key: {_reason(exc)}"
                ) from None
        return context


def _check_not_expired(cert_file: Path) -> None:
    """Refuse a client certificate that is expired or not yet valid: etcd would only
    close the connection (TLS 1.3 reports it after the handshake), with no reason."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return  # load_cert_chain names the problem
    now = datetime.now(UTC)
    if now > cert.not_valid_after_utc:
        raise RegistryAccessError(
            f"--etcd-cert (registry.cert_file) {cert_file}: the client certificate expired "
            f"on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it"
        )
    if now < cert.not_valid_before_utc:
        raise RegistryAccessError(
            f"--etcd-cert (registry.cert_file) {cert_file}: the client certificate is not "
            f"valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC; check the clock"
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason)
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def tls_problem(exc: BaseException, endpoint: str) -> RegistryAccessError | None:
    """A one-line ``RegistryAccessError`` if ``exc`` (or its cause) is a TLS failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            why = str(seen.verify_message or seen.reason)
            fix = (
                "renew etcd's server certificate"
                if "expired" in why
                else "check --etcd-ca (registry.ca_file): it must be the CA that signed "
                "etcd's certificate, for this host name"
            )
            return RegistryAccessError(f"etcd {endpoint}: certificate verify failed ({why}); {fix}")
        if isinstance(seen, ssl.SSLError):
            why = str(seen.reason or seen)
            if "EXPIRED" in why.upper():
                fix = "renew the client certificate (--etcd-cert, registry.cert_file)"
            else:
                fix = "check --etcd-cert/--etcd-key and that etcd trusts their CA"
            return RegistryAccessError(f"etcd {endpoint}: TLS handshake refused ({why}); {fix}")
        seen = seen.__cause__ or seen.__context__
    return None


def _closed_hint(exc: BaseException, endpoint: str) -> str:
    """What a bare closed connection on https most likely means (etcd does not say)."""
    if endpoint.startswith("https://") and isinstance(exc, httpx.ReadError) and not str(exc):
        return (
            " (connection closed after the TLS handshake: etcd may have refused the client "
            "certificate; check --etcd-cert/--etcd-key and that etcd trusts their CA)"
        )
    return ""


def _key_of(body: JSON) -> str:
    raw = body.get("key")
    if not isinstance(raw, str):
        return "?"
    try:
        return _unb64(raw).decode("utf-8", "replace")
    except ValueError:
        return "?"


class EtcdRegistry:
    """A ``Registry`` backed by one etcd cluster through its JSON gateway.

    Args:
        endpoints: client URLs such as ``http://10.0.0.1:2379``; on a
            connection error or timeout the next one is tried, each once.
        timeout: the bound of each call (and of connecting a watch), seconds.
        security: TLS files and credentials (None: plain, no auth).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        if not endpoints:
            raise RegistryError("etcd endpoints: at least one URL is required")
        self._endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._current = 0
        self._timeout = timeout
        self._security = security or EtcdSecurity()
        tls = any(url.startswith("https://") for url in self._endpoints)
        # With plain http endpoints no TLS is ever spoken; verify=False keeps httpx from
        # building a default context with the system's CA bundle, which costs ~0.2 CPU-s
        # at start (a quarter of a daemon's start-up, measured in bench/control_plane.py).
        verify: ssl.SSLContext | bool = self._security.ssl_context() if tls else False
        self._client = httpx.AsyncClient(timeout=timeout, verify=verify)
        self._tokens: dict[str, str] = {}
        """Auth token per endpoint (etcd's simple tokens are valid on their member only)."""

    async def _post(self, path: str, body: JSON) -> JSON:
        failures: list[str] = []
        for endpoint in self._rotation():
            where = f"{endpoint}{path}"
            with trio.move_on_after(self._timeout):
                try:
                    data = await self._call(endpoint, path, body)
                except RegistryAccessError:
                    raise
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    problem = tls_problem(exc, endpoint)
                    if problem is not None:
                        raise problem from None
                    failures.append(f"{endpoint}: {exc!r}{_closed_hint(exc, endpoint)}")
                    continue
                self._current = self._endpoints.index(endpoint)
                return data
            failures.append(f"{endpoint}: no answer within {self._timeout} s ({where})")
        raise RegistryUnavailable(f"etcd {path} failed on every endpoint: {'; '.join(failures)}")

    async def _call(self, endpoint: str, path: str, body: JSON) -> JSON:
        """One call on one endpoint, authenticating first (and again once, if the token
        has become invalid)."""
        where = f"{endpoint}{path}"
        for attempt in range(2):
            headers = await self._auth_headers(endpoint)
            response = await self._client.post(where, json=body, headers=headers)
            try:
                return _check(response, where)
            except _Refused as exc:
                if attempt == 0 and self._token_rejected(endpoint, exc):
                    continue
                raise self._access_error(exc, endpoint, body) from None
        raise AssertionError("unreachable")

    async def _auth_headers(self, endpoint: str) -> dict[str, str]:
        if self._security.username is None:
            return {}
        token = self._tokens.get(endpoint)
        if token is None:
            token = await self._authenticate(endpoint)
            self._tokens[endpoint] = token
        return {"Authorization": token}

    async def _authenticate(self, endpoint: str) -> str:
        where = f"{endpoint}/v3/auth/authenticate"
        user = self._security.username
        credentials = {"name": user, "password": self._security.password or ""}
        response = await self._client.post(where, json=credentials)
        try:
            data = _check(response, where)
        except _Refused as exc:
            if exc.code == _INVALID_ARGUMENT or "authentication failed" in str(exc):
                raise RegistryAccessError(
                    f"etcd {endpoint}: authentication failed for user {user!r}; check "
                    "--etcd-user and the password (--etcd-password-file, VNETD_ETCD_PASSWORD)"
                ) from None
            if "authentication is not enabled" in str(exc):
                raise RegistryAccessError(
                    f"etcd {endpoint}: authentication is not enabled on this etcd; "
                    "drop --etcd-user, or enable auth (docs/security.md)"
                ) from None
            raise
        token = data.get("token")
        if not isinstance(token, str) or not token:
            raise RegistryError(f"etcd {where}: no token in the answer")
        return token

    def _token_rejected(self, endpoint: str, exc: _Refused) -> bool:
        """Forget a token etcd no longer accepts; True if authenticating again may help."""
        text = str(exc)
        if self._security.username is None:
            return False
        if exc.code == _UNAUTHENTICATED or "invalid auth token" in text:
            self._tokens.pop(endpoint, None)
            return True
        return False

    def _access_error(self, exc: _Refused, endpoint: str, body: JSON) -> RegistryError:
        text = str(exc)
        if exc.code == _PERMISSION_DENIED or "permission denied" in text:
            user = self._security.username or "(none)"
            return RegistryAccessError(
                f"etcd {endpoint}: permission denied for user {user} on key {_key_of(body)!r}; "
                "grant the user's role readwrite on the mesh prefix (docs/security.md)"
            )
        if "user name is empty" in text or exc.code == _UNAUTHENTICATED:
            return RegistryAccessError(
                f"etcd {endpoint}: etcd requires authentication; give --etcd-user and "
                "--etcd-password-file (or VNETD_ETCD_USER, VNETD_ETCD_PASSWORD)"
            )
        return exc

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
    ) -> AbstractAsyncContextManager[AsyncIterator[list[WatchEvent]]]:
        return self._watch(prefix, start_revision)

    @asynccontextmanager
    async def _watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
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
                    headers = await self._auth_headers(endpoint)
                    response = await attempt.enter_async_context(
                        self._client.stream(
                            "POST", where, json=body, timeout=timeout, headers=headers
                        )
                    )
                    if response.status_code >= 400:
                        await response.aread()
                        _check(response, where)
                    lines = response.aiter_lines()
                    first = await _next_message(lines)
                except RegistryAccessError:
                    await attempt.aclose()
                    raise
                except _Refused as exc:
                    await attempt.aclose()
                    self._token_rejected(endpoint, exc)
                    raise self._access_error(exc, endpoint, body) from None
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    await attempt.aclose()
                    problem = tls_problem(exc, endpoint)
                    if problem is not None:
                        raise problem from None
                    if "invalid auth token" in str(exc) or "code 16" in str(exc):
                        self._tokens.pop(endpoint, None)
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


async def _watch_events(lines: AsyncIterator[str]) -> AsyncGenerator[list[WatchEvent], None]:
    """The events of each watch message, as one batch (messages without events are skipped)."""
    while True:
        try:
            result = await _next_message(lines)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise RegistryUnavailable(f"etcd watch: stream broke: {exc!r}") from exc
        _raise_for_watch(result)
        batch = [_watch_event(event) for event in result.get("events", [])]
        if batch:
            yield batch


def _watch_event(event: JSON) -> WatchEvent:
    kv = event["kv"]
    return WatchEvent(
        kind="delete" if event.get("type") == "DELETE" else "put",
        key=_unb64(kv["key"]).decode("utf-8", "surrogateescape"),
        value=_unb64(kv.get("value", "")),
        mod_revision=int(kv.get("mod_revision", 0)),
        create_revision=int(kv.get("create_revision", 0)),
    )


@asynccontextmanager
async def open_etcd_registry(
    endpoints: Sequence[str], security: EtcdSecurity | None = None
) -> AsyncIterator[EtcdRegistry]:
    """An ``EtcdRegistry`` that is closed (shielded from cancellation) on exit."""
    registry = EtcdRegistry(endpoints, security=security)
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True):
            await registry.aclose()
