"""At most so many warnings of one kind a minute, the rest counted into one summary line.

A writer of the registry chooses how many bad entries, refused rewrites or key
copies every daemon sees (100,000 junk keys, say); one line each would be as
many lines on every daemon. Written here rather than with ``logging``'s filters:
the summary needs the count of what was not named, per kind.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

NAMED = 20
"""Lines named per ``WINDOW`` for one kind; the rest go into one summary line."""
WINDOW = 60.0


class LogLimit:
    """Warnings of one kind (``plural``: "bad registry entries"), ``NAMED`` a window."""

    def __init__(
        self,
        log: logging.Logger,
        plural: str,
        short: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._plural, self._short, self._clock = log, plural, short, clock
        self._window_start = -math.inf
        self._named = 0
        self._unnamed = 0

    def warn(self, line: Callable[[], str], total: int) -> None:
        """Log ``line()`` unless this window has named its share; ``total``: how many of
        this kind were seen so far, this one included (for the summary)."""
        now = self._clock()
        if now - self._window_start >= WINDOW:
            if self._unnamed:
                self._log.warning(
                    "skipped %d more %s without naming them (%d %s seen in all)",
                    self._unnamed, self._plural, total - 1, self._short,
                )  # fmt: skip
            self._window_start, self._named, self._unnamed = now, 0, 0
        if self._named >= NAMED:
            self._unnamed += 1
            return
        self._named += 1
        self._log.warning("%s", line())
        if self._named == NAMED:
            self._log.warning(
                "more than %d %s in %.0f s: counting the rest, naming them again after that",
                NAMED, self._plural, WINDOW,
            )  # fmt: skip
