"""``run_relay``: a relay's list+watch on the registry and its HTTP side, in one nursery."""

from __future__ import annotations

import logging

import trio

from vnetd.registry.base import Registry
from vnetd.registry.relay.app import Changes, RelayApp, serve_relay
from vnetd.registry.relay.cache import WINDOW_EVENTS, MemberCache
from vnetd.registry.relay.tls import RelayTls, keep_loaded, server_context
from vnetd.registry.relay.upstream import StoreRevision, follow

log = logging.getLogger("vnetd.relay")


async def run_relay(
    registry: Registry,
    prefix: str,
    listen: list[str],
    *,
    window_events: int = WINDOW_EVENTS,
    tls: RelayTls | None = None,
    task_status: trio.TaskStatus[RelayApp] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Relay the keys under ``prefix`` of ``registry`` on ``listen`` until cancelled (over
    HTTPS with ``tls``, its files loaded again when they change); started (with the app,
    whose ``bound`` holds the addresses) once its first list was tried and it listens.

    Raises:
        OSError: an address cannot be bound.
        SpecError: ``tls``'s files are not a usable certificate and key.

    Cancellation: the watch and every served stream are closed.
    """
    context, loaded = server_context(tls) if tls is not None else (None, None)
    cache = MemberCache(prefix, window_events)
    changes = Changes()
    app = RelayApp(cache, changes, StoreRevision(registry, prefix))
    async with trio.open_nursery() as nursery:
        if context is not None and tls is not None and loaded is not None:
            nursery.start_soon(keep_loaded, context, tls, loaded)
        await nursery.start(follow, registry, cache, changes)
        app.bound = await nursery.start(serve_relay, listen, app, context)
        log.info("relay: serving %s at %s", prefix, ", ".join(app.bound))
        task_status.started(app)
