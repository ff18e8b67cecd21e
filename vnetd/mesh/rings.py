"""The rings a daemon's doorbell took: which wait for their peer, and who rang lately.

A ring names only an endpoint (the datagram's source), and nothing of it is
trusted, so what one costs is bounded here: a ring is looked up by its
endpoint (``AppliedPeers.at``, no walk of the peers); an endpoint that rang
under ``RING_REPEAT`` s ago is dropped (a responder's WireGuard rings again
only with its 5 s retry, so only a flood comes faster); a ring from an
endpoint no peer has yet waits ``RING_MEMORY`` s, at most ``MAX_BELLS`` at
once. The endpoints of peers we hold are kept apart from that cap (their
table is bounded by the peers), so a flood from unknown endpoints cannot shut
out the rings of the peers we hold. docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from vnetd.model import Peer

RING_MEMORY = 5.0
"""Seconds a ring from an endpoint no peer of ours has yet is kept: the ringer may know us
before we know it (our watch lags), and its own retry comes only after 5 s."""
RING_REPEAT = 1.0
"""Seconds after a ring taken from an endpoint in which another from it is dropped.
Under WireGuard's 5 s between two initiations of one peer (``RekeyTimeout``)."""
MAX_BELLS = 4096
"""Rings kept at once (waiting, or remembered for ``RING_REPEAT``); more are dropped (a
flood of forged rings would otherwise grow the tables)."""


class RingBook:
    """Rings taken from the doorbell: the ones waiting for a peer at their endpoint, and
    when each endpoint last rang. Both tables are in the order the rings came, so expiry
    pops from the front (O(the expired))."""

    def __init__(self) -> None:
        self.waiting: dict[str, float] = {}
        """A ringer's endpoint -> when it rang, for rings no peer has answered yet."""
        self._rang: dict[str, float] = {}  # endpoints no peer has: when each last rang
        self._rang_known: dict[str, float] = {}  # our peers' endpoints: the same

    def take(self, endpoint: str, now: float, *, known: bool = False) -> bool:
        """Keep a ring from ``endpoint`` (False: dropped); ``known``: a peer we hold is
        there, so the ring is answered at once and the flood cap does not apply."""
        _expire(self._rang, now - RING_REPEAT)
        _expire(self._rang_known, now - RING_REPEAT)
        _expire(self.waiting, now - RING_MEMORY)
        rang = self._rang_known if known else self._rang
        full = not known and (len(rang) >= MAX_BELLS or len(self.waiting) >= MAX_BELLS)
        if endpoint in rang or (full and endpoint not in self.waiting):
            return False
        rang[endpoint] = now
        self.waiting.pop(endpoint, None)
        self.waiting[endpoint] = now
        return True

    def answered(
        self, peers_at: Callable[[str], Iterable[Peer]], now: float, only: str | None = None
    ) -> list[Peer]:
        """The peers at the endpoints of waiting rings (``only``: that endpoint's ring
        alone), whose rings leave the table; rings older than ``RING_MEMORY`` leave too."""
        _expire(self.waiting, now - RING_MEMORY)
        endpoints = list(self.waiting) if only is None else [only] if only in self.waiting else []
        found: list[Peer] = []
        for endpoint in endpoints:
            peers = list(peers_at(endpoint))
            if peers:
                del self.waiting[endpoint]
                found += peers
        return found


def _expire(table: dict[str, float], before: float) -> None:
    """Drop the entries of ``before`` or older from the front of ``table`` (oldest first)."""
    while table:
        endpoint, at = next(iter(table.items()))
        if at > before:
            return
        del table[endpoint]
