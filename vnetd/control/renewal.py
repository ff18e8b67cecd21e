"""When a claim's lease is renewed next (docs/architecture.md, "Registry layout": the lease).

A lease of ``ttl`` seconds is kept alive at a third of its TTL; in a large mesh at
rest less often (``renewal_interval``: its renewals cost etcd at most
``KEEPALIVES`` a second), never later than half the TTL. A keepalive that gets no
answer is tried again within half a second, backing off to a sixth of the TTL,
never more than a third of the TTL after it was sent: two missed renewals in a row
would otherwise cost the lease (``RenewalSchedule``). The claim itself, and what
it does when the lease is lost, is ``control.claim``'s.
"""

from __future__ import annotations

import trio

from vnetd.control.retry import Backoff
from vnetd.pacing import spaced

KEEPALIVE_RETRY = 0.5
"""Seconds before a keepalive that got no answer is first tried again (then doubling)."""
KEEPALIVES = 32.0
"""Lease renewals per second a whole mesh may cost etcd (``vnetd.pacing``), as long as
each daemon still renews by half its TTL."""


def renewal_interval(ttl: float, members: int) -> float:
    """Seconds between a daemon's renewals of its ``ttl`` s lease in a mesh of ``members``:
    a third of the TTL, or longer so that the mesh's renewals cost etcd ``KEEPALIVES`` a
    second, at most half the TTL (the rest of the lease is for retries). Every daemon
    renews on its own claim's clock, so the renewals are spread without jitter."""
    return min(spaced(ttl / 3, members, KEEPALIVES), ttl / 2)


class RenewalSchedule:
    """When the next keepalive of one lease is due (``due``, on ``trio.current_time()``).

    A renewal that failed is retried ``KEEPALIVE_RETRY`` s after its failure (a
    sixth of the TTL if that is shorter), doubling up to a sixth of the TTL,
    and never later than a third of the TTL after it was sent (a renewal that
    timed out after longer than that is retried at once): the third renewal
    after the last good one is due when the lease ends, so waiting a whole
    interval after each failure loses the lease to two failures in a row
    (etcd's own client sends a missing renewal again every 0.5 s). Nor later
    than halfway to the lease's end (at least that first delay after the
    failure), so the tries close in on the end and an outage that ends a
    second or two before it still keeps the lease.
    """

    def __init__(self, ttl: int, renewed_at: float) -> None:
        """A lease of ``ttl`` s granted or renewed at ``renewed_at``."""
        self._ttl = ttl
        self.due = renewed_at + ttl / 3
        self._first_retry = min(KEEPALIVE_RETRY, ttl / 6)
        self._retry = Backoff(initial=self._first_retry, maximum=ttl / 6)

    def failed(self, sent: float, renewed_at: float) -> None:
        """The keepalive sent at ``sent`` had no answer; the lease was last renewed at
        ``renewed_at``, so it ends a TTL after that at the latest."""
        now = trio.current_time()
        expires = renewed_at + self._ttl
        delay = min(self._retry.next_delay(), max(self._first_retry, (expires - now) / 2))
        self.due = min(sent + self._ttl / 3, now + delay)

    def renewed(self, sent: float, interval: float) -> None:
        """The keepalive sent at ``sent`` renewed the lease: the next is ``interval`` s
        after it."""
        self._retry.reset()
        self.due = sent + interval
