"""``EtcdRegistry``: the ``Registry`` protocol over etcd's v3 JSON gateway.

Hand-written on purpose: python-etcd3 no longer imports with current
protobuf releases, and the gateway (``POST /v3/...`` with JSON bodies) needs
nothing but httpx. The gateway's encoding is ``gateway``'s; TLS, the
credentials and their errors are ``security``'s; the auth token of each member
``tokens``'; paged lists ``pages``' and roles and users ``auth``' (both through
``transport``, which ``gateway`` implements).

Several members: each attempt is bounded and a failed endpoint is tried last
(``endpoints``); a watch moves off a member that cannot serve it (``watch``).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import trio

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.access_base import AccessPlan, User
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.etcd.auth import ROOT, apply_plan, enable_auth
from vnetd.registry.etcd.endpoints import EndpointOrder
from vnetd.registry.etcd.gateway import (
    JSON,
    REQUIRE_LEADER,
    WATCH,
    GatewayAuth,
    GatewayRanges,
    capped_lines,
    check_response,
    count_call,
    create_all_call,
    create_call,
    delete_call,
    existing_entry,
    first_entry,
    get_call,
    grant_call,
    keepalive_call,
    next_message,
    raise_for_watch,
    replace_call,
    revoke_call,
    watch_events,
    watch_request,
)
from vnetd.registry.etcd.httpcore_package import import_httpcore
from vnetd.registry.etcd.pages import ListResumes, list_pages
from vnetd.registry.etcd.security import (
    AuthRequired,
    EtcdSecurity,
    RegistryAccessError,
    SharedTls,
    closed_hint,
    tls_problem,
)
from vnetd.registry.etcd.tokens import AuthTokens
from vnetd.registry.etcd.transport import (
    FAILED_PRECONDITION,
    NOT_FOUND,
    PageTooLarge,
    Refused,
    RegistryFull,
)
from vnetd.registry.etcd.watch import QuietHints, resuming_watch

__all__ = [
    "EtcdRegistry",
    "EtcdSecurity",
    "RegistryAccessError",
    "SharedTls",
    "open_etcd_registry",
]

IDLE_KEPT = 300.0
"""Seconds an idle connection to etcd is kept for the next call. httpx's default, 5 s,
is shorter than the gaps between a daemon's calls at rest (renewals every TTL / 3 or
more, quiet checks and spec reads spaced by the mesh's size), so each of those opened
a new connection, and with TLS made both sides do a handshake: 3 connects a minute
for one daemon at rest with 1023 peers (``bench/join_storm.py``, strace). A kept
connection that etcd closed is seen closed when it is next taken and a new one is
opened (httpcore); one to a member that stopped answering fails its call's bound, as
a new one would."""


class EtcdRegistry:
    """A ``Registry`` backed by one etcd cluster through its JSON gateway.

    Args:
        endpoints: client URLs such as ``http://10.0.0.1:2379``; on a
            connection error or timeout the next one is tried, each once.
        timeout: the bound of each call (and of connecting a watch), seconds.
        security: TLS files and credentials (None: plain, no auth).
        lease_ttl: the TTL of the leases this client will keep alive, if known
            before the first ``grant``: it bounds every attempt from the start
            (``endpoints``).
        shared_tls: where the client takes its TLS context from, shared with
            other clients of this process (None: its own).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        security: EtcdSecurity | None = None,
        lease_ttl: int | None = None,
        shared_tls: SharedTls | None = None,
    ) -> None:
        if not endpoints:
            raise RegistryError("etcd endpoints: at least one URL is required")
        self._endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._order = EndpointOrder(self._endpoints, timeout)
        self.quiet_hints = QuietHints()
        if lease_ttl:
            self._order.lease_granted(lease_ttl)
        self._timeout = timeout
        self._security = security or EtcdSecurity()
        tls = any(url.startswith("https://") for url in self._endpoints)
        # With plain http endpoints no TLS is ever spoken; verify=False keeps httpx from
        # building a default context with the system's CA bundle, which costs ~0.2 CPU-s
        # at start (a quarter of a daemon's start-up, measured in bench/control_plane.py).
        verify: ssl.SSLContext | bool = False
        if shared_tls is not None:
            verify = shared_tls.context(self._security, tls)
        elif tls:
            verify = self._security.ssl_context()
        import_httpcore()  # before httpx imports it: see that module
        # httpx's default limits but for how long an idle connection is kept.
        limits = httpx.Limits(
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=IDLE_KEPT
        )
        self._client = httpx.AsyncClient(timeout=timeout, verify=verify, limits=limits)
        self._tokens = AuthTokens(self._security)
        self._resumes = ListResumes()  # lists that stopped, resumed by the next (pages)

    async def _post(
        self, path: str, body: JSON, cap: int | None = None, extra: float = 0.0
    ) -> JSON:
        """One call; each attempt's bound (``endpoints``) plus ``extra`` s (``pages``)."""
        failures: list[str] = []
        for endpoint, usual in self._order.attempts():
            bound = usual + extra
            where = f"{endpoint}{path}"
            with trio.move_on_after(bound):
                try:
                    data = await self._call(endpoint, path, body, cap, extra)
                except (RegistryAccessError, RegistryFull):
                    raise  # every member would say the same (NOSPACE is cluster-wide)
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    problem = tls_problem(exc, endpoint)
                    if problem is not None:
                        raise problem from None
                    failures.append(f"{endpoint}: {exc!r}{closed_hint(exc, endpoint)}")
                    self._order.failed(endpoint)
                    continue
                self._order.answered(endpoint)
                return data
            failures.append(f"{endpoint}: no answer within {bound:g} s ({where})")
            self._order.failed(endpoint)
        raise RegistryUnavailable(f"etcd {path} failed on every endpoint: {'; '.join(failures)}")

    async def _call(
        self, endpoint: str, path: str, body: JSON, cap: int | None = None, extra: float = 0.0
    ) -> JSON:
        """One call on one endpoint, authenticating first (and again once, if the token
        has become invalid); an answer over ``cap`` bytes raises ``PageTooLarge``."""
        where = f"{endpoint}{path}"
        for attempt in range(2):
            headers = {**REQUIRE_LEADER, **await self._tokens.headers(self._client, endpoint)}
            if cap is None:
                response = await self._client.post(where, json=body, headers=headers)
            else:
                response = await self._capped_post(where, body, headers, cap, extra)
            try:
                return check_response(response, where)
            except Refused as exc:
                if attempt == 0 and self._tokens.rejected(endpoint, exc):
                    continue
                raise self._tokens.access_error(exc, endpoint, body) from None
        raise AssertionError("unreachable")

    async def _capped_post(
        self, where: str, body: JSON, headers: dict[str, str], cap: int, extra: float = 0.0
    ) -> httpx.Response:
        """A POST whose answer is read only up to ``cap`` bytes (``pages``); httpx's
        timeouts get ``extra`` s too (etcd's gateway encodes a whole page before sending)."""
        timeout = httpx.Timeout(self._timeout + extra)
        stream = self._client.stream("POST", where, json=body, headers=headers, timeout=timeout)
        async with stream as response:
            content = bytearray()
            async for chunk in response.aiter_bytes():
                content += chunk
                if len(content) > cap:
                    raise PageTooLarge(f"etcd {where}: answer over {cap} bytes")
        return httpx.Response(
            response.status_code, content=bytes(content), request=response.request
        )

    async def apply_access(
        self, plan: AccessPlan, password_for: Callable[[User], str]
    ) -> list[str]:
        """``AccessControl``: etcd's roles and users made the plan's (``auth``)."""
        return await apply_plan(GatewayAuth(self.call), plan, password_for)

    async def auth_enabled(self) -> bool:
        """``AccessControl``: whether etcd demands a user, asked as no user (a registry
        opened with one cannot tell: with auth off its authentication is refused).

        Raises:
            RegistryError: this registry was opened with a user, or etcd refused the
                question for another reason.
        """
        if self._security.username is not None:
            raise RegistryError("etcd auth_enabled: ask through a registry opened without a user")
        try:
            await GatewayAuth(self.call).user_roles(ROOT)
        except AuthRequired:
            return True
        except Refused as exc:
            if exc.code != FAILED_PRECONDITION or "not found" not in str(exc):
                raise
        return False

    async def enable_auth(self, root_password: str) -> list[str]:
        """``AccessControl``: user root made if absent, then auth on (``auth``)."""
        return await enable_auth(GatewayAuth(self.call), root_password)

    async def call(self, path: str, body: JSON) -> JSON:
        """One gateway call by path (``/v3/auth/...`` for ``auth``), with the same
        failover, bounds and token handling as the registry's own calls.

        Raises:
            Refused: etcd refused it (its gRPC code in ``code``).
            RegistryAccessError: our credentials do not allow it.
            RegistryUnavailable: no endpoint answered.
        """
        return await self._post(path, body)

    @property
    def endpoint_count(self) -> int:
        return len(self._endpoints)

    def endpoint_failed(self, endpoint: str) -> None:
        self._order.failed(endpoint)

    async def member_serves(self, endpoint: str, request: JSON) -> tuple[str | None, int]:
        """(None, keys counted) when ``endpoint`` answers a linearizable count of the
        keys ``request`` watches within the per-endpoint bound (0 keys when it refused
        us: a credential problem is not a health one), else (why not, 0); ``watch``
        asks this of a quiet watch, and spaces its checks by the count."""
        bound = self._order.attempt_timeout
        with trio.move_on_after(bound):
            try:
                data = await self._call(endpoint, *count_call(request))
            except (Refused, RegistryAccessError):
                return None, 0
            except (httpx.TransportError, RegistryUnavailable) as exc:
                return f"a read on it failed: {exc}", 0
            return None, int(data.get("count", 0))
        return f"a read on it had no answer within {bound:g} s", 0

    async def get(self, key: str) -> KeyValue | None:
        return first_entry(await self._post(*get_call(key)))

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await list_pages(GatewayRanges(self._post), prefix, self._resumes)

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        data = await self._post(*create_call(key, value, lease))
        if data.get("succeeded", False):
            return None
        existing = existing_entry(data)
        if existing is None:
            raise RegistryError(f"etcd create {key!r}: key exists but could not be read")
        return existing

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        data = await self._post(*replace_call(key, value, mod_revision, lease))
        return bool(data.get("succeeded", False))

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        if not items:
            return True
        data = await self._post(*create_all_call(items))
        return bool(data.get("succeeded", False))

    async def delete(self, key: str) -> bool:
        data = await self._post(*delete_call(key))
        return int(data.get("deleted", 0)) > 0

    async def grant(self, ttl: int) -> int:
        self._order.lease_granted(ttl)
        data = await self._post(*grant_call(ttl))
        return int(data["ID"])

    async def keepalive(self, lease: int) -> int:
        data = await self._post(*keepalive_call(lease))
        return int(data.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        try:
            await self._post(*revoke_call(lease))
        except Refused as exc:
            if exc.code != NOT_FOUND:
                raise

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[AsyncIterator[list[WatchEvent]]]:
        request = watch_request(prefix)
        async with AsyncExitStack() as stack:
            lines = await stack.enter_async_context(resuming_watch(self, request, start_revision))
            events = watch_events(lines)
            stack.push_async_callback(events.aclose)
            yield events

    async def open_watch_stream(
        self, stack: AsyncExitStack, body: JSON
    ) -> tuple[str, AsyncIterator[str]]:
        """Open a leader-required stream on the first endpoint that confirms the watch
        (each attempt bounded as a call's): (endpoint, its lines after the confirmation)."""
        timeout = httpx.Timeout(self._timeout, read=None)
        failures: list[str] = []
        for endpoint, bound in self._order.attempts():
            where = f"{endpoint}{WATCH}"
            attempt = AsyncExitStack()
            with trio.move_on_after(bound):
                try:
                    auth = await self._tokens.headers(self._client, endpoint)
                    headers = {**REQUIRE_LEADER, **auth}
                    response = await attempt.enter_async_context(
                        self._client.stream(
                            "POST", where, json=body, timeout=timeout, headers=headers
                        )
                    )
                    if response.status_code >= 400:
                        await response.aread()
                        check_response(response, where)
                    lines = capped_lines(response.aiter_bytes())
                    first = await next_message(lines)
                except RegistryAccessError:
                    await attempt.aclose()
                    raise
                except Refused as exc:
                    await attempt.aclose()
                    self._tokens.rejected(endpoint, exc)
                    raise self._tokens.access_error(exc, endpoint, body) from None
                except (httpx.TransportError, RegistryUnavailable) as exc:
                    await attempt.aclose()
                    problem = tls_problem(exc, endpoint)
                    if problem is not None:
                        raise problem from None
                    if "invalid auth token" in str(exc) or "code 16" in str(exc):
                        self._tokens.forget(endpoint)
                    failures.append(f"{endpoint}: {exc!r}")
                    self._order.failed(endpoint)
                    continue
                except BaseException:
                    await attempt.aclose()
                    raise
                self._order.answered(endpoint)
                stack.push_async_callback(attempt.aclose)
                if not first.get("created", False):
                    raise_for_watch(first)
                _check_not_behind(first, body)
                return endpoint, lines
            await attempt.aclose()
            failures.append(f"{endpoint}: no watch confirmation within {bound:g} s")
            self._order.failed(endpoint)
        raise RegistryUnavailable(f"etcd watch failed on every endpoint: {'; '.join(failures)}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _check_not_behind(created: JSON, body: JSON) -> None:
    """A watch resumed after a revision the store has not reached: the store was reset
    (restored, or a new cluster), and etcd would wait silently for revisions that will
    carry other writes. Raised as unavailable: the watcher lists again, which finds it."""
    store = int(created.get("header", {}).get("revision", 0))
    start = int(body.get("create_request", {}).get("start_revision", 0))
    if store and start > store + 1:
        raise RegistryUnavailable(
            f"etcd watch from revision {start}: the store is at revision {store} "
            "(it was reset); listing again"
        )


@asynccontextmanager
async def open_etcd_registry(
    endpoints: Sequence[str],
    security: EtcdSecurity | None = None,
    *,
    lease_ttl: int | None = None,
    shared_tls: SharedTls | None = None,
) -> AsyncIterator[EtcdRegistry]:
    """An ``EtcdRegistry`` that is closed (shielded from cancellation) on exit."""
    registry = EtcdRegistry(
        endpoints, security=security, lease_ttl=lease_ttl, shared_tls=shared_tls
    )
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True):
            await registry.aclose()
