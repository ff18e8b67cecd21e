"""When the member watch should pause to take a join storm in batches.

etcd sends a watcher that is up to date one message per revision, and one
that resumes from an older revision up to 1000 revisions per message. So in a
storm the watch ends after each batch, pauses, and resumes from the last
revision seen; a single join into a quiet mesh still arrives on the live
watch at once. Why these numbers: docs/architecture.md, "Watch".
"""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger("vnetd.watch")

STORM_EVENTS = 8
"""At least this many member events within ``STORM_WINDOW`` ..."""
STORM_RATE = 20.0
"""... arriving at this many per second or more make a storm: a batch then carries
20 events or more, enough to pay for the resume (through etcd's JSON gateway a
resume costs etcd about as much as 12 live messages, the daemon about 20)."""
STORM_WINDOW = 2.0
"""Seconds of batches the rate is taken over (longer than the longest pause)."""
BATCH_EVENTS = 64
"""In a storm the watch pauses long enough for about this many events per batch ..."""
PAUSE_MIN = 0.1
PAUSE_MAX = 1.0
"""... within these bounds (seconds); etcd adds up to 0.1 s before it sends a resumed
watch its batch."""
MEMBERS_PER_PAUSE_SECOND = 256
PAUSE_MAX_LARGE = 4.0
"""A larger mesh may pause longer: up to one second per this many members, at most
``PAUSE_MAX_LARGE``. Its storm is N²/2 events, so the resumes saved grow with N, and a
few seconds are small against its formation; a mesh of 256 or fewer keeps ``PAUSE_MAX``.
A storm is then a rate at which the longest pause gathers ``STORM_RATE`` × ``PAUSE_MAX``
events (20: what pays for a resume), so 5/s at 1024 members."""
FULL_BATCH = 1000
"""etcd's most revisions per watch message: a batch this big means more is waiting."""


class StormGauge:
    """The member event rate over the last ``STORM_WINDOW`` seconds, and the pause it calls for."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, int]] = deque()
        """(start, events): each batch with the time the one before it arrived."""
        self._events = 0
        self._last = -float("inf")
        self.active = False
        self.batches = 0
        """Batches taken in the current storm."""

    def pause_after(self, now: float, events: int, members: int = 0) -> float:
        """Note a batch of ``events`` that arrived at ``now``; the seconds to pause before
        resuming the watch, 0 to stay on the live watch. ``members``: how many the mesh
        has now (a larger one pauses longer, ``MEMBERS_PER_PAUSE_SECOND``).

        A batch covers the time since the one before it (the pause included),
        or starts now after a quiet spell. A full batch is never followed by a
        pause: etcd has more waiting and sends it at once.
        """
        longest = min(max(PAUSE_MAX, members / MEMBERS_PER_PAUSE_SECOND), PAUSE_MAX_LARGE)
        window = max(STORM_WINDOW, 2 * longest)  # longer than the longest pause
        start = self._last if now - self._last <= window else now
        self._last = now
        self._seen.append((start, events))
        self._events += events
        while self._seen[0][0] < now - window:
            self._events -= self._seen.popleft()[1]
        rate = self._events / max(now - self._seen[0][0], PAUSE_MIN)
        storm = self._events >= STORM_EVENTS and rate * longest >= STORM_RATE * PAUSE_MAX
        pause = min(max(BATCH_EVENTS / rate, PAUSE_MIN), longest) if storm else 0.0
        if storm and not self.active:
            log.info(
                "member events arriving at %.0f/s: taking them in batches every %.0f ms",
                rate,
                pause * 1000,
            )
        elif self.active and not storm:
            log.info(
                "member events slowed down: back to a live watch after %d batches", self.batches
            )
        self.active = storm
        self.batches = self.batches + 1 if storm else 0
        return pause if events < FULL_BATCH else 0.0
