"""What a relay holds: the members under one prefix and a window of recent events.

Pure (no I/O): ``upstream`` feeds it from one list and one watch on etcd, ``app``
serves it. Records are kept as the registry read them (``KeyValue``, ``WatchEvent``) and
re-encoded unchanged, so the relay can delay a record, never change one.

* ``replace``: a list; the window is emptied and its floor is the list's revision,
  so a watch from after it is served and one from before it is answered "compacted"
  (the daemon lists again, from the relay). Each replace starts a new ``epoch``: the
  watches served before it end "compacted", since the events between the two lists
  are unknown (a relay behind by a compaction, or one that lost etcd for a while).
* ``apply``: a watch batch; the window keeps the last ``window_events`` events, and
  the floor rises past the ones it drops.
* ``page``: a page of a paged list (``registry.etcd.pages``) at the current revision or
  at one of the last ``SNAPSHOTS_KEPT`` revisions a first page was read at, so that a
  list read through the relay is one snapshot while the members change.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from vnetd.registry.base import KeyValue, WatchEvent

WINDOW_EVENTS = 20_000
"""Events kept for watchers that resume: a join storm of 10,000 ranks and as many
lease ends, each record well under a kilobyte (about 12 MB)."""
SNAPSHOTS_KEPT = 8
"""Revisions whose member list is kept for the later pages of a paged list."""


@dataclass(frozen=True)
class Page:
    """One answer to a range: its entries, whether more follow, how many there are in
    all, and the revision it was read at."""

    kvs: list[KeyValue]
    more: bool
    count: int
    revision: int


class MemberCache:
    """The members under ``prefix`` as of ``revision``, and the events after ``floor``."""

    def __init__(
        self, prefix: str, window_events: int = WINDOW_EVENTS, snapshots_kept: int = SNAPSHOTS_KEPT
    ) -> None:
        self.prefix = prefix
        self.window_events = window_events
        self.snapshots_kept = snapshots_kept
        self.members: dict[str, KeyValue] = {}
        self.revision = 0
        """Every event under the prefix up to this revision is in ``members``."""
        self.floor = 0
        """Every event after this revision is in the window."""
        self.epoch = 0
        self.synced = False
        """False before the first list, and from a lost watch to the next list."""
        self._window: list[WatchEvent] = []
        self._first = 0  # index of the window's oldest event in ``_window``
        self._snapshots: OrderedDict[int, list[KeyValue]] = OrderedDict()
        self._listed = 0  # the last list's revision: events up to it are in it

    def replace(self, kvs: Iterable[KeyValue], revision: int) -> None:
        """Take a list read at ``revision``; a new epoch."""
        self.members = {kv.key: kv for kv in kvs}
        self.revision = self.floor = self._listed = revision
        self._window, self._first = [], 0
        self._snapshots.clear()
        self.epoch += 1
        self.synced = True

    def apply(self, batch: Iterable[WatchEvent]) -> int:
        """Take a watch batch (events the last list held are skipped; several events of one
        revision, such as a lease's keys, are all kept); returns how many were new."""
        taken = 0
        for event in batch:
            if event.mod_revision <= self._listed:
                continue
            if event.kind == "delete":
                self.members.pop(event.key, None)
            else:
                self.members[event.key] = KeyValue(
                    event.key, event.value, event.create_revision, event.mod_revision, event.lease
                )
            self._window.append(event)
            self.revision = event.mod_revision
            taken += 1
        self._trim()
        return taken

    def lost(self) -> None:
        """The watch on etcd is lost: nothing is served until the next list."""
        self.synced = False

    def _trim(self) -> None:
        kept = len(self._window) - self._first
        if kept <= self.window_events:
            return
        drop = kept - self.window_events
        self.floor = self._window[self._first + drop - 1].mod_revision
        self._first += drop
        if self._first > len(self._window) // 2:
            del self._window[: self._first]
            self._first = 0

    @property
    def window(self) -> list[WatchEvent]:
        return self._window[self._first :]

    def events_since(self, start: int) -> list[WatchEvent] | None:
        """The events at or after revision ``start``; None when some of them left the
        window (or came before the last list): the watcher must list again."""
        if start <= self.floor:
            return None
        index = bisect.bisect_left(
            self._window, start, lo=self._first, key=lambda event: event.mod_revision
        )
        return self._window[index:]

    def page(self, start: str, end: str, limit: int, revision: int) -> Page | None:
        """The entries with ``start <= key < end`` (``end`` empty: ``start`` alone) at
        ``revision`` (0: the current one), at most ``limit`` (0: all); None when that
        revision is no longer kept."""
        at = revision or self.revision
        entries = self._snapshot(at)
        if entries is None:
            return None
        low = bisect.bisect_left(entries, start, key=lambda kv: kv.key)
        if end:
            high = bisect.bisect_left(entries, end, lo=low, key=lambda kv: kv.key)
        else:
            high = low + 1 if low < len(entries) and entries[low].key == start else low
        chosen = entries[low:high]
        shown = chosen[:limit] if limit else chosen
        return Page(shown, len(shown) < len(chosen), len(chosen), at)

    def _snapshot(self, revision: int) -> list[KeyValue] | None:
        kept = self._snapshots.get(revision)
        if kept is not None:
            return kept
        if revision != self.revision:
            return None
        entries = sorted(self.members.values(), key=lambda kv: kv.key)
        self._snapshots[revision] = entries
        while len(self._snapshots) > self.snapshots_kept:
            self._snapshots.popitem(last=False)
        return entries
