"""Backoff for registry calls, and logging a registry outage once per change."""

from __future__ import annotations

import logging
import random
from collections import Counter

log = logging.getLogger("vnetd.registry")


class Backoff:
    """Exponential backoff with jitter: ``initial`` doubling up to ``maximum``."""

    def __init__(self, initial: float = 0.2, maximum: float = 3.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * 2)
        return delay * random.uniform(0.75, 1.0)

    def reset(self) -> None:
        self._next = self.initial


class RegistryHealth:
    """Tracks whether the registry answers and logs only the transitions."""

    def __init__(self) -> None:
        self.reachable: bool | None = None
        self.errors = 0
        self.errors_by_operation: Counter[str] = Counter()

    def ok(self) -> None:
        if self.reachable is False:
            log.info("registry reachable again")
        self.reachable = True

    def failed(self, operation: str, exc: Exception) -> None:
        self.errors += 1
        self.errors_by_operation[operation] += 1
        if self.reachable is not False:
            log.warning(
                "registry unreachable during %s: %s; data plane left as it is, retrying",
                operation,
                exc,
            )
        self.reachable = False
