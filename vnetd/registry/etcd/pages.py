"""A prefix listed in pages of bounded size, at one revision, resumed where it stopped
(docs/architecture.md, "Bounded reads").

One range request for a whole prefix makes etcd read, and its gateway send, every
value at once, and the client hold them all: a writer that fills the prefix with
1 MiB values makes a daemon's next list cost hundreds of MiB (and etcd seconds). So
a list reads pages: the first of ``FIRST_PAGE_KEYS`` keys, each next one sized from
the bytes per key of the last (about ``PAGE_TARGET``, at most ``PAGE_KEYS`` keys);
an answer is read only up to ``PAGE_BYTES`` (a longer one is dropped unread and
asked again for an eighth of the keys, down to one); and every page after the first
is read at the first one's revision, so the pages are one snapshot. etcd reads only
a page's values (it counts the rest from its index). Keys and values are then
bounded as every read's are (``bounds``).

A page of big values takes etcd's gateway long to encode on a loaded machine, so
its call gets more time than the call's usual bound: the bytes it is expected to
carry (its keys at the last page's bytes per key) at ``SLOW_RATE`` when they are
over ``PAGE_TARGET``, and more after each page with no answer (``MISS_TIME``,
doubled), at most ``PAGE_TIME_CAP``. A page no endpoint answered is asked again
(``PAGE_RETRIES``); when it still has none the list fails, but what it read is kept
(``ListResumes``): the next list of that prefix resumes at the page after, at the
same revision, so the result is still one snapshot. If that revision was compacted
meanwhile, the list starts over from its first page (logged). Written by hand:
etcd's JSON gateway has no client library that pages (docs/architecture.md, "etcd
transport"). Written for any transport: a page is read through
``transport.RangeReader`` (``gateway.GatewayRanges`` over the JSON gateway).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from operator import attrgetter

import trio

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.base import KeyValue
from vnetd.registry.etcd.transport import (
    OUT_OF_RANGE,
    PageTooLarge,
    RangePage,
    RangeReader,
    RangeRequest,
    Refused,
    prefix_end,
)

FIRST_PAGE_KEYS = 2
"""Keys of the first page: at most 2 entries of etcd's largest (1.5 MiB) for etcd to
read and encode; under junk a page costs etcd's gateway about a second per few MiB
on a loaded machine."""
log = logging.getLogger("vnetd.registry")

PAGE_KEYS = 2048
"""The most keys of one page: about 1 MB of answer for member records."""
PAGE_TARGET = 1024 * 1024
"""The answer size the next page is sized for, from the last page's bytes per key."""
PAGE_BYTES = 4 * 1024 * 1024
"""The most of one answer that is read; etcd's default request limit (1.5 MiB, key and
value together) keeps any one entry, base64 in JSON, near 2 MiB."""
SHRINK = 8
PAGE_RETRIES = 2
SLOW_RATE = 256 * 1024
"""Bytes a second a page's answer is given time for, beyond the call's bound: a page
of one 1.4 MiB value (about 1.9 MB of JSON) gets 7 s more. A quiet machine sends
such a page in well under a second; at load ~120 on 2 cores it took over 5 s."""
MISS_TIME = 5.0
"""Added for a page after one that had no answer, doubled for each further miss."""
PAGE_TIME_CAP = 30.0
"""The most time added to one page's call (invariant 8: every wait has a bound)."""
RESUME_WITHIN = 300.0
"""How long (s) a list that stopped is kept to resume; an older one starts over (its
snapshot would be older than what the caller may have seen since)."""
RESUMES_KEPT = 4
"""Prefixes whose stopped list is kept (a client lists a few prefixes at most)."""


@dataclass
class ListProgress:
    """How far one list of a prefix got: the snapshot's revision (0: no page yet), the
    next page's first key and size, and what the pages so far held."""

    start: bytes
    revision: int = 0
    limit: int = FIRST_PAGE_KEYS
    kvs: list[KeyValue] = field(default_factory=list)
    per_key: int = 0
    """Bytes per key of the last page (0: none read yet)."""
    misses: int = 0
    """Attempts at the next page that had no answer, in a row."""
    pages: int = 0
    at: float = 0.0
    """``trio.current_time()`` of the last page read (or of the start)."""

    def extra_time(self) -> float:
        """What the next page's call gets beyond its usual bound (s): time for its bytes
        when they are over ``PAGE_TARGET`` (a page of one big value: pages of smaller
        ones are sized to it, and keep the usual bounds, which fail over fast), and
        more after a miss."""
        expected = self.limit * self.per_key
        for_bytes = expected / SLOW_RATE if expected > PAGE_TARGET else 0.0
        missed = MISS_TIME * 2 ** (self.misses - 1) if self.misses else 0.0
        return min(PAGE_TIME_CAP, max(for_bytes, missed))


class ListResumes:
    """The lists that stopped for want of an answer, by prefix, to resume."""

    def __init__(self) -> None:
        self._stopped: dict[str, ListProgress] = {}

    def take(self, prefix: str) -> ListProgress:
        """Where a list of ``prefix`` starts: where the last one stopped, if recent."""
        now = trio.current_time()
        progress = self._stopped.pop(prefix, None)
        if progress is not None and progress.revision:
            if now - progress.at <= RESUME_WITHIN:
                log.info(
                    "etcd list %s: resuming after page %d (%d keys, revision %d)",
                    prefix, progress.pages, len(progress.kvs), progress.revision,
                )  # fmt: skip
                return progress
            log.info(
                "etcd list %s: the list that stopped %.0f s ago is too old to resume; "
                "starting over from the first page", prefix, now - progress.at,
            )  # fmt: skip
        fresh = ListProgress(start=prefix.encode("utf-8", "surrogateescape"), at=now)
        if progress is not None:  # no page read: only its misses carry over
            fresh.misses = progress.misses
        return fresh

    def keep(self, prefix: str, progress: ListProgress) -> None:
        self._stopped.pop(prefix, None)
        self._stopped[prefix] = progress
        while len(self._stopped) > RESUMES_KEPT:
            del self._stopped[next(iter(self._stopped))]

    def __len__(self) -> int:
        return len(self._stopped)


async def list_pages(
    ranges: RangeReader, prefix: str, resumes: ListResumes | None = None
) -> tuple[list[KeyValue], int]:
    """Every key under ``prefix``, sorted by key, and the revision they were read at.

    Args:
        resumes: where a list that stopped is kept, and resumed from (None: every
            list starts at its first page).

    Raises:
        RegistryError: one entry alone is over ``PAGE_BYTES`` (etcd's request limit
            was raised that far), or etcd refused a page.
        RegistryUnavailable: no endpoint answered (what was read is kept in
            ``resumes``), or a revision was compacted between pages twice in a row.
    """
    resumes = resumes if resumes is not None else ListResumes()
    progress = resumes.take(prefix)
    for restart in range(2):
        try:
            await _read_all(ranges, prefix, progress)
            break
        except RegistryUnavailable:
            resumes.keep(prefix, progress)
            raise
        except Refused as exc:
            if exc.code != OUT_OF_RANGE:
                raise
            if restart:
                raise RegistryUnavailable(f"etcd list {prefix}: {exc}; listing again") from None
            log.warning(
                "etcd list %s: revision %d was compacted after page %d; starting over "
                "from the first page", prefix, progress.revision, progress.pages,
            )  # fmt: skip
            progress = ListProgress(start=prefix.encode("utf-8", "surrogateescape"))
    # By key alone (keys are unique): comparing whole records was a tenth of a list.
    return sorted(progress.kvs, key=attrgetter("key")), progress.revision


async def _read_all(ranges: RangeReader, prefix: str, progress: ListProgress) -> None:
    """Read the pages from ``progress`` on into it, until the last."""
    end = prefix_end(prefix)
    while True:
        request = RangeRequest(progress.start, end, progress.limit, progress.revision)
        try:
            page = await _page(ranges, request, prefix, progress)
        except PageTooLarge:
            if progress.limit == 1:
                raise RegistryError(
                    f"etcd list {prefix}: the entry after {progress.start[:120]!r} is alone "
                    f"over {PAGE_BYTES} bytes; delete it"
                ) from None
            progress.limit = max(1, progress.limit // SHRINK)
            continue
        progress.revision = progress.revision or page.revision
        progress.kvs += page.kvs
        progress.pages += 1
        progress.at = trio.current_time()
        if not page.kvs or not page.more:
            return
        progress.start = page.last_key + b"\0"
        progress.per_key = bytes_per_key(page)
        progress.limit = next_limit(progress.per_key)


async def _page(
    ranges: RangeReader, request: RangeRequest, prefix: str, progress: ListProgress
) -> RangePage:
    """One page, asked again ``PAGE_RETRIES`` times when no endpoint answered it, each
    time with more time (``ListProgress.extra_time``). A first page is asked once: with
    no revision yet there is nothing to resume, the caller lists again."""
    retries = PAGE_RETRIES if progress.revision else 0
    for attempt in range(retries + 1):
        try:
            page = await ranges.range_page(request, PAGE_BYTES, progress.extra_time())
        except RegistryUnavailable:
            progress.misses += 1
            if attempt == retries:
                raise
            log.info(
                "etcd list %s: a page had no answer; asking again with %.0f s more",
                prefix, progress.extra_time(),
            )  # fmt: skip
            continue
        progress.misses = 0
        return page
    raise AssertionError("unreachable")


def bytes_per_key(page: RangePage) -> int:
    """The bytes of answer each key of ``page`` took (its key and value, as sent)."""
    return max(1, page.size // len(page.kvs))


def next_limit(per_key: int) -> int:
    """Keys for the next page: about ``PAGE_TARGET`` at the last page's bytes per key
    (``bytes_per_key``), between 1 and ``PAGE_KEYS``."""
    return max(1, min(PAGE_KEYS, PAGE_TARGET // per_key))
