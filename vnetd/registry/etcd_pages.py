"""A prefix listed in pages of bounded size, at one revision (docs/architecture.md,
"Bounded reads").

One range request for a whole prefix makes etcd read, and its gateway send, every
value at once, and the client hold them all: a writer that fills the prefix with
1 MiB values makes a daemon's next list cost hundreds of MiB (and etcd seconds). So
a list reads pages: the first of ``FIRST_PAGE_KEYS`` keys, each next one sized from
the bytes per key of the last (about ``PAGE_TARGET``, at most ``PAGE_KEYS`` keys);
an answer is read only up to ``PAGE_BYTES`` (a longer one is dropped unread and
asked again for an eighth of the keys, down to one); a page no endpoint answered is
asked again, not the whole list; and every page after the first is read at the
first one's revision, so the pages are one snapshot. etcd reads only a page's
values (it counts the rest from its index). Keys and values are then bounded as
every read's are (``bounds``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from operator import attrgetter

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.base import KeyValue
from vnetd.registry.etcd_gateway import JSON, Refused, b64, key_value, prefix_end, unb64

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
OUT_OF_RANGE = 11
"""The gRPC code of a range at a compacted revision."""


class PageTooLarge(RegistryError):
    """An answer ran over the byte bound; it was dropped unread."""


PageCall = Callable[[JSON, int], Awaitable[JSON]]
"""One range request and the byte bound of its answer; raises ``PageTooLarge``."""


async def list_pages(call: PageCall, prefix: str) -> tuple[list[KeyValue], int]:
    """Every key under ``prefix``, sorted by key, and the revision they were read at.

    Raises:
        RegistryError: one entry alone is over ``PAGE_BYTES`` (etcd's request limit
            was raised that far), or etcd refused a page.
        RegistryUnavailable: no endpoint answered, or the revision was compacted
            between pages (the caller lists again).
    """
    start = prefix.encode("utf-8", "surrogateescape")
    end = b64(prefix_end(prefix))
    revision = 0
    limit = FIRST_PAGE_KEYS
    kvs: list[KeyValue] = []
    while True:
        body: JSON = {"key": b64(start), "range_end": end, "limit": str(limit)}
        if revision:
            body["revision"] = str(revision)
        try:
            data = await _page(call, body, prefix) if revision else await call(body, PAGE_BYTES)
        except Refused as exc:
            if exc.code == OUT_OF_RANGE:
                raise RegistryUnavailable(f"etcd list {prefix}: {exc}; listing again") from None
            raise
        except PageTooLarge:
            if limit == 1:
                raise RegistryError(
                    f"etcd list {prefix}: the entry after {start[:120]!r} is alone over "
                    f"{PAGE_BYTES} bytes; delete it"
                ) from None
            limit = max(1, limit // SHRINK)
            continue
        revision = revision or int(data["header"]["revision"])
        page = data.get("kvs", [])
        kvs += [key_value(raw) for raw in page]
        if not page or not data.get("more", False):
            break
        start = unb64(page[-1]["key"]) + b"\0"
        limit = next_limit(page)
    # By key alone (keys are unique): comparing whole records was a tenth of a list.
    return sorted(kvs, key=attrgetter("key")), revision


async def _page(call: PageCall, body: JSON, prefix: str) -> JSON:
    """A page after the first, tried again ``PAGE_RETRIES`` times when no endpoint
    answered it: it is read at a fixed revision, so a list resumes where it stopped
    instead of starting over (a list of a prefix full of junk takes many pages)."""
    for attempt in range(PAGE_RETRIES + 1):
        try:
            return await call(body, PAGE_BYTES)
        except RegistryUnavailable:
            if attempt == PAGE_RETRIES:
                raise
            log.info("etcd list %s: a page had no answer; asking again", prefix)
    raise AssertionError("unreachable")


def next_limit(page: list[JSON]) -> int:
    """Keys for the next page: about ``PAGE_TARGET`` at the last page's bytes per key
    (its keys and values, base64), between 1 and ``PAGE_KEYS``."""
    size = sum(len(raw.get("key", "")) + len(raw.get("value", "")) + 100 for raw in page)
    per_key = max(1, size // len(page))
    return max(1, min(PAGE_KEYS, PAGE_TARGET // per_key))
