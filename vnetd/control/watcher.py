"""Keep a local view of the members: list, then watch from that revision.

A compaction or a watch error lists again and replaces the view; the watch
is resumed from the last revision every ``resync_interval`` (a large mesh:
less often, ``vnetd.pacing``); a store reset
holds the missing members for a grace period; readers refuse rewrites that
break the claim rules. The why of each is in docs/architecture.md, "Watch",
"Store resets" and "Readers enforce the claim rules".
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import NoReturn

import trio

from vnetd.control.member_view import COPY_ORDER, RESET_GRACE_TTLS, MemberView
from vnetd.control.membership import members_prefix
from vnetd.control.retry import Backoff, RegistryHealth, retry_registry
from vnetd.control.storm import StormGauge
from vnetd.errors import RegistryUnavailable, WatchCompacted, WatchMoved
from vnetd.pacing import period
from vnetd.registry.base import KeyValue, Registry
from vnetd.spec import MeshSpec

__all__ = ["COPY_ORDER", "MemberView", "sync_members"]

log = logging.getLogger("vnetd.watch")

WATCH_RESTARTS = 4.0
"""Watch restarts per second a whole mesh may cost etcd (``vnetd.pacing``)."""


async def sync_members(
    registry: Registry,
    spec: MeshSpec,
    view: MemberView,
    health: RegistryHealth,
    *,
    resync_interval: float = 60.0,
    reset_grace: float | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``view`` in step with the registry forever.

    Args:
        resync_interval: the watch is restarted (from the last revision seen) this
            often, a large mesh less often (``vnetd.pacing``).
        reset_grace: how long members missing after a registry reset are
            kept; None means ``RESET_GRACE_TTLS`` lease TTLs.

    Cancellation: safe at any point; the view keeps its last state.
    """
    prefix = members_prefix(spec)
    grace = RESET_GRACE_TTLS * spec.registry.lease_ttl if reset_grace is None else reset_grace
    backoff = Backoff()
    gauge = StormGauge()
    listed = False
    resuming = False  # the next watch resumes a storm's after a pause
    task_status.started()

    async def follow() -> NoReturn:
        """List, then watch; list again after a compaction, a reset's grace or a
        stream that ended; in a storm, end the watch after a batch and resume it
        after a pause. Raises ``RegistryUnavailable``; a retry lists first, except
        after a storm's resume that could not open (a loaded etcd or client): that
        is tried once more as a resume, not as an O(N) list for etcd and for us (a
        reset store refuses a resume: ``EtcdRegistry`` checks its revision)."""
        nonlocal listed, resuming
        while True:
            opening = resumed = False
            try:
                if not listed:
                    kvs, revision = await registry.list_prefix(prefix)
                    health.ok()
                    backoff.reset()
                    _take_list(spec, view, kvs, revision, grace)
                    listed = True
                # The watch also ends when a held member's grace does: the list
                # that follows drops it if it has not registered again.
                held_until = view.held_until()
                resync_at = trio.current_time() + period(
                    resync_interval, len(view.members), WATCH_RESTARTS
                )
                pause = 0.0
                with trio.move_on_at(min(resync_at, held_until)) as timer:
                    async with AsyncExitStack() as stack:
                        opening, resumed = True, resuming
                        batches = await stack.enter_async_context(
                            registry.watch(prefix, view.revision + 1)
                        )
                        opening = resuming = False
                        health.ok()
                        async for batch in batches:
                            view.apply_batch(spec, batch)
                            pause = gauge.pause_after(
                                trio.current_time(), len(batch), len(view.members)
                            )
                            if pause:
                                break
                    if not pause:
                        log.info("member watch ended; listing members again")
                        listed = False
                        await trio.sleep(backoff.next_delay())
                if pause:
                    await trio.sleep(pause)  # then resume: etcd sends the batch since
                    resuming = True
                elif timer.cancelled_caught and held_until <= resync_at:
                    listed = False
            except WatchMoved as exc:
                log.info("%s; watching from revision %d there", exc, view.revision + 1)
            except WatchCompacted as exc:
                log.info("%s; listing members again", exc)
                listed = False
            except RegistryUnavailable:
                # A storm's resume that did not open is tried once more as a resume.
                listed = listed and opening and resumed
                resuming = False
                raise

    await retry_registry("watch", follow, health, backoff)


def _take_list(
    spec: MeshSpec, view: MemberView, kvs: list[KeyValue], revision: int, grace: float
) -> None:
    """Replace the view with a fresh list, holding the missing members after a reset."""
    now = trio.current_time()
    if not (view.synced and revision < view.revision):
        view.replace(spec, kvs, revision, now=now)
        return
    old_revision = view.revision
    view.replace(spec, kvs, revision, now=now, hold_until=now + grace)
    log.warning(
        "registry was reset (revision %d → %d): keeping %d members for %.0f s "
        "while they re-register",
        old_revision,
        revision,
        len(view.held),
        grace,
    )
