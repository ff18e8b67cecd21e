"""A relay's one list+watch on the registry, kept in its ``MemberCache``.

As a daemon's member watch does (``control.watcher``, flannel's ``resyncWatch``): list,
then watch from the revision after, resumed every ``RESYNC_INTERVAL`` (a stream that died
without a word heals). A compaction that left the relay behind lists again while it
serves what it has; the new list is a new epoch: the watches it serves end "compacted"
and their daemons list again, from the relay. A lost registry marks the cache out of
step at once (its watches end, so their daemons move to their next endpoint) and lists
again after a backoff. Works on any ``Registry``, so the unit tests run it on the
memory registry.
"""

from __future__ import annotations

import logging
import random

import trio

from vnetd.errors import RegistryUnavailable, WatchCompacted
from vnetd.registry.base import Registry
from vnetd.registry.relay.app import Changes
from vnetd.registry.relay.cache import MemberCache

log = logging.getLogger("vnetd.relay")

RESYNC_INTERVAL = 60.0
"""Seconds between resumes of the relay's watch (``follow``)."""
FIRST_DELAY = 0.5
MAX_DELAY = 10.0
PROBE_SUFFIX = "\0relay-revision-probe/"
"""An empty range under the prefix (its credential reads only that), listed to learn
etcd's current revision."""
PROBE_SHARED_FOR = 0.5
"""Seconds one revision probe answers every watch that asks."""


async def follow(
    registry: Registry,
    cache: MemberCache,
    changes: Changes,
    *,
    resync_interval: float = RESYNC_INTERVAL,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``cache`` in step with ``registry`` forever; started once the first list is in
    (or failed: the relay serves 503 until one succeeds).

    Args:
        resync_interval: the watch is resumed (from the revision after the cache's) this
            often, which heals a stream that died without a word, as a daemon's does.

    Cancellation: safe at any point.
    """
    delay, started, listed = FIRST_DELAY, False, False
    while True:
        try:
            if not listed:
                kvs, revision = await registry.list_prefix(cache.prefix)
                cache.replace(kvs, revision)
                listed = True
                changes.notify()
                log.info(
                    "relay: listed %d members of %s at revision %d",
                    len(kvs), cache.prefix, revision,
                )  # fmt: skip
                delay = FIRST_DELAY
            if not started:
                task_status.started()
                started = True
            with trio.move_on_after(resync_interval):
                async with registry.watch(cache.prefix, cache.revision + 1) as batches:
                    async for batch in batches:
                        if cache.apply(batch):
                            changes.notify()
                log.info("relay: the watch on %s ended; listing again", cache.prefix)
                listed = False
        except WatchCompacted as exc:
            log.warning("relay: %s; listing %s again", exc, cache.prefix)
            listed = False
        except RegistryUnavailable as exc:
            listed = False
            if cache.synced:
                log.warning(
                    "relay: lost the registry (%s); serving nothing until it lists again", exc
                )
            cache.lost()
            changes.notify()
            if not started:
                task_status.started()
                started = True
            await trio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(MAX_DELAY, delay * 2)


class StoreRevision:
    """etcd's current revision, read by listing an empty range (etcd counts it from its
    index), shared by the watches that ask within ``PROBE_SHARED_FOR`` s."""

    def __init__(self, registry: Registry, prefix: str) -> None:
        self._registry = registry
        self._probe = prefix + PROBE_SUFFIX
        self._lock = trio.Lock()
        self._value = 0
        self._at = -PROBE_SHARED_FOR

    async def __call__(self) -> int:
        async with self._lock:
            if trio.current_time() - self._at >= PROBE_SHARED_FOR:
                try:
                    _, self._value = await self._registry.list_prefix(self._probe)
                except RegistryUnavailable:
                    return self._value
                self._at = trio.current_time()
            return self._value
