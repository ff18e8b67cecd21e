"""Which etcd endpoint a request tries next, and for how long.

Every request is bounded per endpoint and fails over fast. An attempt with
no answer within ``min(ATTEMPT_TIMEOUT, TTL / ATTEMPT_TTL_SHARE)`` (TTL: the
shortest lease the client granted) moves on to the next endpoint; only the
last attempt of a call gets the call's whole timeout, so a single endpoint
(one etcd, or a Service in front of several, tried a second time on a new
connection) keeps its old bound. Why TTL/5: a keepalive is sent a third of
the TTL after the previous one, so two members that do not answer (2 × TTL/5)
still leave the lease more than a quarter of its TTL; why 2 s at most: a
healthy member answers in milliseconds, and 2 s is etcdctl's own dial
timeout. An endpoint that failed is tried after the others for
``FAILED_ENDPOINT_LAST_FOR`` s.

Written for any transport: it knows endpoints by name only. (Every request also asks
for a member with a leader, which is the transport's to say: ``gateway.REQUIRE_LEADER``.)
docs/operations.md, "etcd cluster faults", says what each fault costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

ATTEMPT_TIMEOUT = 2.0
"""The most one attempt on one endpoint may take, unless it is a call's last."""
ATTEMPT_TTL_SHARE = 5
"""One attempt takes at most this share of the shortest lease TTL granted (TTL/5)."""
FAILED_ENDPOINT_LAST_FOR = 30.0
"""How long an endpoint that failed is tried after the others."""


class EndpointOrder:
    """The endpoints of one client: the current one, the failed ones, the bounds."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        self.endpoints = list(endpoints)
        self.current = 0
        self.timeout = timeout
        """The bound of a call's last attempt."""
        self.attempt_timeout = min(ATTEMPT_TIMEOUT, timeout)
        """The bound of every other attempt."""
        self._failed_at: dict[str, float] = {}
        """Endpoint -> ``trio.current_time()`` of its last failure (cleared by an answer)."""

    def rotation(self) -> list[str]:
        """The endpoints from the current one on; those that failed lately last,
        the longest ago first."""
        n = len(self.endpoints)
        ordered = [self.endpoints[(self.current + i) % n] for i in range(n)]
        now = trio.current_time()
        recent = {e: t for e, t in self._failed_at.items() if now - t < FAILED_ENDPOINT_LAST_FOR}
        return [e for e in ordered if e not in recent] + sorted(recent, key=recent.__getitem__)

    def attempts(self) -> list[tuple[str, float]]:
        """(endpoint, bound) of each attempt of one call. One endpoint is tried
        twice, the second time on a new connection."""
        rotation = self.rotation()
        if len(rotation) == 1:
            rotation = rotation * 2
        bounds = [self.attempt_timeout] * (len(rotation) - 1) + [self.timeout]
        return list(zip(rotation, bounds, strict=True))

    def failed(self, endpoint: str) -> None:
        """Try ``endpoint`` after the others for ``FAILED_ENDPOINT_LAST_FOR`` s."""
        self._failed_at[endpoint] = trio.current_time()

    def answered(self, endpoint: str) -> None:
        """``endpoint`` answered: it is the current one, and no longer failed."""
        self.current = self.endpoints.index(endpoint)
        self._failed_at.pop(endpoint, None)

    def lease_granted(self, ttl: int) -> None:
        """Keep every attempt but a call's last within ``ttl / ATTEMPT_TTL_SHARE``."""
        self.attempt_timeout = min(self.attempt_timeout, ttl / ATTEMPT_TTL_SHARE)
