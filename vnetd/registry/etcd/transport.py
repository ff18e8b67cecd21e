"""What the transport-neutral parts of the etcd backend need of a transport: the calls of
paged lists (``pages``) and of roles and users (``auth``), as decoded records, and the
errors etcd answers them with (docs/architecture.md, "Module map").

``gateway`` implements these over etcd's v3 JSON gateway; another transport (native
gRPC, say) would implement the same and reuse ``pages`` and ``auth`` as they are.
Nothing here knows base64, JSON or HTTP: keys are bytes or text, revisions ints, and
etcd's refusals carry its gRPC status code whichever way they arrived.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.access_base import Permission
from vnetd.registry.base import KeyValue

# gRPC status codes etcd refuses a request with.
INVALID_ARGUMENT = 3
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
"""A write past etcd's quota (``NO_SPACE``), and other limits ("too many requests")."""
FAILED_PRECONDITION = 9
OUT_OF_RANGE = 11
"""A range at a compacted revision."""
UNAUTHENTICATED = 16
UNAVAILABLE_CODES = frozenset({1, 4, 14})  # CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE
NO_SPACE = "database space exceeded"
"""etcd's words ("etcdserver: mvcc: database space exceeded", ``RESOURCE_EXHAUSTED``) for a
put, a txn with a put or a lease grant while its NOSPACE alarm is on, or that would raise
it; the JSON gateway answers HTTP 429 with that message and code 8 (etcd 3.4.23 and 3.5.1,
checked in the lab)."""


class Refused(RegistryError):
    """etcd refused the request (not an outage); ``code`` is its gRPC code."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class RegistryFull(RegistryUnavailable):
    """etcd refused a write for space: its quota is reached and the cluster-wide NOSPACE
    alarm is on. Reads, deletes and keepalives of existing leases still pass; puts, txns
    with a put and lease grants do not, until an operator frees space and disarms the
    alarm (docs/operations.md, "Registry full"). A ``RegistryUnavailable``, so every
    registry task retries it with backoff and keeps the data plane (invariant 5); its
    ``kind`` lets them name it."""

    kind = "full"


def no_space(message: str, code: int | None) -> bool:
    """Whether etcd's refusal ``message`` (gRPC ``code``, if the answer had one) is NOSPACE.

    By etcd's words, not by the code alone: ``RESOURCE_EXHAUSTED`` is also "too many
    requests" (a member whose applied index lags) and gRPC's own size limits."""
    return NO_SPACE in message and code in (RESOURCE_EXHAUSTED, None)


class PageTooLarge(RegistryError):
    """An answer ran over the byte bound; it was dropped unread."""


def prefix_end(prefix: str) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    raw = bytearray(prefix.encode("utf-8", "surrogateescape"))
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"  # every key
    raw[-1] += 1
    return bytes(raw)


class RangeRequest(NamedTuple):
    """The keys from ``start`` up to ``end`` (excluded), at most ``limit`` of them, read at
    ``revision`` (0: the store's current one). Records here are named tuples, not
    dataclasses: a frozen dataclass costs 0.4 ms of CPU to define, on the way to the
    claim (docs/architecture.md, "Start-up"), a named tuple a tenth of that."""

    start: bytes
    end: bytes
    limit: int
    revision: int = 0


class RangePage(NamedTuple):
    """One answer to a ``RangeRequest``."""

    kvs: list[KeyValue]
    """The entries, bounded as every read's are (``registry.bounds``)."""
    revision: int
    """The store's revision the page was read at."""
    more: bool
    """Keys in the range are left after this page."""
    last_key: bytes
    """The last entry's key as stored (not cut by the bounds); b"" for an empty page."""
    size: int
    """The bytes of answer the entries took, as the transport counts them."""


class RangeReader(Protocol):
    """The range call of paged lists (``pages``)."""

    async def range_page(self, request: RangeRequest, cap: int, extra: float) -> RangePage:
        """One page, its answer read only up to ``cap`` bytes, its call given ``extra`` s
        beyond its usual bound.

        Raises:
            PageTooLarge: the answer ran over ``cap``.
            Refused: etcd refused it (``OUT_OF_RANGE``: ``revision`` was compacted).
            RegistryUnavailable: no endpoint answered.
        """
        ...


class AuthCalls(Protocol):
    """etcd's auth calls that bring roles and users to a plan (``auth``). Each raises
    ``Refused`` with etcd's code and message when etcd refuses it."""

    async def add_role(self, name: str) -> None: ...

    async def role_permissions(self, role: str) -> set[Permission]:
        """The role's permissions; a range is a prefix's only if it ends where the
        prefix's keys end (``prefix_end``)."""
        ...

    async def grant_permission(self, role: str, permission: Permission) -> None: ...

    async def revoke_permission(self, role: str, permission: Permission) -> None: ...

    async def user_roles(self, name: str) -> set[str]: ...

    async def add_user(self, name: str, password: str) -> None: ...

    async def grant_role(self, user: str, role: str) -> None: ...

    async def revoke_role(self, user: str, role: str) -> None: ...

    async def enable_auth(self) -> None:
        """Turn etcd's auth on (a no-op when it is on: etcd 3.4 and 3.5 answer success)."""
        ...
