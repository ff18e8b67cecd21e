"""A watch batch as a reader decodes it: the last event per key (``last_per_key``),
and what a member taken with its proof unverified keeps for later (``Unproven``);
docs/architecture.md, "Proofs"."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from vnetd.registry.base import WatchEvent


@dataclass(frozen=True)
class Unproven:
    """A member's record taken with its proof not verified: what verifies it later."""

    rank: int
    key: str
    value: bytes
    lease: int
    seen: tuple[int, bytes]
    mod_revision: int


def last_per_key(events: Iterable[WatchEvent]) -> list[WatchEvent]:
    """A watch batch reduced to the last event per key, in order (docs/architecture.md,
    "Proofs"). Before a last put, an event is dropped only when the put ends as it would
    after it: a delete (the put after it is a new entry, a new create revision: a new
    claim either way), or an earlier record of the same signing key with a lower seq
    (the rewrite and order rules give the same answer for the last one). Every other
    event of that key is kept (another key's record makes the last a rewrite, a seq not
    below the last's makes it a replay), and so is every event before a last delete.
    The signing key and seq are read unverified. A forged last put that names a genuine
    earlier one's signing key with a higher seq lets that earlier put be dropped: the
    forgery is refused when its proof is checked, nothing forged is taken, and the view
    keeps the member it had before the batch until the holder writes its record back."""
    events = list(events)
    last = {event.key: index for index, event in enumerate(events)}
    if len(last) == len(events):
        return events
    exact = {
        event.key
        for event in events
        if (final := events[last[event.key]]) is not event
        and (final.kind == "delete" or _needed(event, final))
    }
    return [e for i, e in enumerate(events) if last[e.key] == i or e.key in exact]


def _needed(earlier: WatchEvent, final: WatchEvent) -> bool:
    """Whether ``earlier`` may change how ``final``, a put of the same key, is taken."""
    if earlier.kind == "delete":
        return False
    mine, theirs = _signer_seq(earlier.value), _signer_seq(final.value)
    if mine is None or theirs is None:
        return True  # unreadable: keep both, decoding names it
    return not (mine[0] and mine[0] == theirs[0] and mine[1] < theirs[1])


def _signer_seq(value: bytes) -> tuple[str, int] | None:
    try:
        record = json.loads(value)
        signer, seq = record.get("signing_key", ""), record.get("seq", 0)
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return None
    return (signer, seq) if isinstance(signer, str) and isinstance(seq, int) else None
