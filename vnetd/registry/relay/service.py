"""``run_relay``: a relay's list+watch on the registry and its HTTP side, in one nursery."""

from __future__ import annotations

import logging

import trio

from vnetd.registry.base import Registry
from vnetd.registry.relay.app import Changes, RelayApp, serve_relay
from vnetd.registry.relay.cache import WINDOW_EVENTS, MemberCache
from vnetd.registry.relay.upstream import StoreRevision, follow

log = logging.getLogger("vnetd.relay")


async def run_relay(
    registry: Registry,
    prefix: str,
    listen: list[str],
    *,
    window_events: int = WINDOW_EVENTS,
    task_status: trio.TaskStatus[RelayApp] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Relay the keys under ``prefix`` of ``registry`` on ``listen`` until cancelled;
    started (with the app, whose ``bound`` holds the addresses) once its first list was
    tried and it listens.

    Raises:
        OSError: an address cannot be bound.

    Cancellation: the watch and every served stream are closed.
    """
    cache = MemberCache(prefix, window_events)
    changes = Changes()
    app = RelayApp(cache, changes, StoreRevision(registry, prefix))
    async with trio.open_nursery() as nursery:
        await nursery.start(follow, registry, cache, changes)
        app.bound = await nursery.start(serve_relay, listen, app)
        log.info("relay: serving %s at %s", prefix, ", ".join(app.bound))
        task_status.started(app)
