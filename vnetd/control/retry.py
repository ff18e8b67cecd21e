"""Retrying registry calls: backoff, logging an outage once per change, and the one
retry loop every registry task uses (static stability, docs/architecture.md).

The loop is written here rather than taken from ``stamina`` (on PyPI, trio
supported): stamina's jitter is added to the delay while ours scales it by
0.75–1.0, its default hooks log every retry and register Prometheus counters in
the process-wide registry, and two callers need the backoff shared beyond one
retried call (the member watch resets it after a good list, the claim backs
off with it on a refused claim too). None of that is stamina's model.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from vnetd.errors import REGISTRY_FULL_FIX, RegistryUnavailable

log = logging.getLogger("vnetd.registry")

T = TypeVar("T")

WRITES = frozenset({"claim"})
"""Operations whose success shows that the registry takes writes again: a claim or an
update of our record is a txn with a put, which etcd refuses whole while it is full."""


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
    """Tracks whether the registry answers and logs only the transitions.

    A write refused for space (``kind == "full"``: etcd's NOSPACE alarm) is counted and
    named apart: reads and keepalives still pass, so the registry is not unreachable,
    and it stays full until one of our writes (``WRITES``) passes again.
    """

    def __init__(self) -> None:
        self.reachable: bool | None = None
        self.errors = 0
        self.errors_by_operation: Counter[str] = Counter()
        self.full: str | None = None
        """etcd's refusal of our last write for space; None once a write passed."""
        self.full_refusals = 0
        """Writes refused for space, all told."""

    def ok(self, operation: str = "") -> None:
        if self.reachable is False:
            log.info("registry reachable again")
        self.reachable = True
        if self.full is not None and operation in WRITES:
            log.info(
                "registry takes writes again (%s passed; %d writes were refused for space)",
                operation,
                self.full_refusals,
            )
            self.full = None

    def failed(self, operation: str, exc: Exception) -> None:
        self.errors += 1
        self.errors_by_operation[operation] += 1
        if getattr(exc, "kind", "") == "full":
            self.full_refusals += 1
            if self.full is None:
                log.warning(
                    "registry full during %s: %s; data plane left as it is, retrying; %s",
                    operation,
                    exc,
                    REGISTRY_FULL_FIX,
                )
            self.full = str(exc)
            return
        if self.reachable is not False:
            log.warning(
                "registry unreachable during %s: %s; data plane left as it is, retrying",
                operation,
                exc,
            )
        self.reachable = False


async def retry_registry(
    operation: str,
    call: Callable[[], Awaitable[T]],
    health: RegistryHealth,
    backoff: Backoff | None = None,
) -> T:
    """``await call()`` until it does not raise ``RegistryUnavailable``; its result.

    Each failure is reported to ``health`` under ``operation`` and followed by
    ``backoff``'s next delay; a success marks the registry reachable. Other
    errors propagate at once.

    Cancellation: safe; nothing is retried after it.
    """
    backoff = backoff or Backoff()
    while True:
        try:
            result = await call()
        except RegistryUnavailable as exc:
            health.failed(operation, exc)
            await trio.sleep(backoff.next_delay())
            continue
        health.ok(operation)
        return result
