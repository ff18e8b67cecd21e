"""Errors a user can cause. The CLI prints the message on one line and exits 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class VnetdError(Exception):
    """Base of every error caused by input or environment, not by a bug."""


class SpecError(VnetdError):
    """The mesh spec is malformed; the message names the key."""


class IdentityError(VnetdError):
    """Rank, key or endpoint could not be determined."""


class RegistryError(VnetdError):
    """The registry refused a request or returned something unusable."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached (connection refused, timeout, 5xx), or refused
    what may pass later; every registry task retries it (invariant 5). ``kind`` names
    which: ``"unreachable"``, or ``"full"`` (a write refused for space: etcd's NOSPACE)."""

    kind = "unreachable"


REGISTRY_FULL_FIX = (
    "free space in etcd: compact, defragment, then disarm the NOSPACE alarm "
    '(docs/operations.md, "Registry full")'
)
"""The fix for a full registry, in one line: what ``doctor``, ``status`` and the log say."""


class WatchMoved(RegistryError):
    """A watch that should go on somewhere else (a relay that answers again): the
    watcher opens it again from the revision after its last event, with no list."""


class WatchCompacted(RegistryError):
    """A watch asked for a revision the registry has already compacted."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch revision compacted (oldest available: {compact_revision})")
        self.compact_revision = compact_revision


class SpecMismatch(VnetdError):
    """The spec stored in the registry differs from the local one."""


class DataplaneError(VnetdError):
    """The WireGuard device or its link could not be configured."""


@contextmanager
def plain_errors() -> Iterator[None]:
    """Re-raise a ``VnetdError`` out of nested nurseries' exception groups as itself,
    so the CLI can print its one line instead of a group traceback."""
    try:
        yield
    except BaseExceptionGroup as group:
        matched, rest = group.split(VnetdError)
        if matched is None or rest is not None:
            raise
        error: BaseException = matched
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        raise error from None
