"""An in-memory data plane with the device's observable semantics, for tests.

It follows WireGuard where the reconciler can see it: an allowed IP belongs
to at most one peer (giving it to peer B takes it from peer A), ``update``
touches only existing peers, ``remove`` of an absent peer is a no-op, and
routes follow the peers exactly as ``UapiDataplane`` moves them. A removed
peer loses its session: added again, it starts with no handshake and zero
counters. ``restart`` rebuilds the device as a restarted wireguard-go does.
The far side of each peer is simulated (``answers``): a handshake this
device starts completes at once, and so does the other side's with a peer
whose endpoint is held (invariant 10).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from dataclasses import replace
from ipaddress import ip_network

from vnetd.dataplane.base import (
    DeviceConfig,
    LinkState,
    keepalive_of,
    key_to_hex,
    route_changes,
)
from vnetd.model import DevicePeer, Plan

log = logging.getLogger("vnetd.dataplane")


class FakeDataplane:
    """A device in memory. ``applied`` records every non-empty plan, in order,
    ``handshakes`` the peers each was asked to start a handshake with, and
    ``peer_reads`` counts whole reads of the device."""

    def __init__(self, config: DeviceConfig) -> None:
        self.config = config
        self.applied: list[Plan] = []
        self.device: dict[str, DevicePeer] = {}
        self.device_routes: set[str] = set()
        self.unreachable: set[str] = {str(net) for net in config.networks}
        self.closed = False
        self.keepalives: dict[str, int] = {}
        """The persistent keepalive each peer was added with (s; 0: none)."""
        self.preshared_keys: dict[str, str | None] = {}
        """The pre-shared key each peer was added with (base64, or None)."""
        self.device_id = secrets.token_hex(8)
        self.handshakes: list[str] = []
        self.answers = True
        """Simulate each peer's far side (``_far_side``); False: it never answers nor
        starts a handshake, so no peer gets one."""
        self.restarts = 0
        self.on_restart: Callable[[str], None] | None = None
        self.peer_reads = 0
        """Calls of ``peers()``: a whole read of the device, O(peers) on a real one."""

    async def peers(self) -> dict[str, DevicePeer]:
        self.peer_reads += 1
        return dict(self.device)

    async def apply(self, plan: Plan) -> None:
        if not plan:
            return
        for key in _public_keys(plan):
            key_to_hex(key)  # the same validation as the device
        for removed in plan.remove:
            self.device.pop(removed.public_key, None)
        for upd in plan.update:
            current = self.device.get(upd.public_key)
            if current is None:
                continue  # update_only
            if upd.endpoint is not None:
                current = replace(current, endpoint=upd.endpoint)
            self.device[upd.public_key] = current
            if upd.allowed_ips is not None:
                self._assign(upd.public_key, upd.allowed_ips)
        if self.config.preshared_key is not None:
            key_to_hex(self.config.preshared_key, "preshared_key")
        for added in plan.add:
            self.preshared_keys[added.public_key] = self.config.preshared_key
            current = self.device.get(added.public_key, DevicePeer(added.public_key, ()))
            if added.endpoint is not None and not added.endpoint_held:
                current = replace(current, endpoint=added.endpoint)
            self.device[added.public_key] = current
            self.keepalives[added.public_key] = keepalive_of(
                added, self.config.persistent_keepalive
            )
            self._assign(added.public_key, added.allowed_ips)
        gone, new = route_changes(plan, self._live_ips())
        self.device_routes = (self.device_routes - gone) | new
        self.applied.append(plan)
        self.handshakes += [key for key in plan.handshake if key in self.device]
        if self.answers:
            self._far_side(plan)
        log.debug(
            "%s: applied %s (routes -%d +%d)",
            self.config.interface,
            plan.describe(),
            len(gone),
            len(new),
        )

    def _live_ips(self) -> AbstractSet[str]:
        """Every allowed IP some peer holds now (after a plan, before its routes)."""
        return {ip for peer in self.device.values() for ip in peer.allowed_ips}

    def _far_side(self, plan: Plan) -> None:
        """The simulated far side of each peer: it answers the handshakes we start, and
        starts one with a peer whose endpoint we hold (which teaches us the endpoint)."""
        started = set(plan.handshake)
        now = time.time()
        for added in plan.add:
            if added.public_key in started or added.endpoint_held:
                current = self.device[added.public_key]
                self.device[added.public_key] = replace(
                    current, endpoint=added.endpoint, last_handshake=now
                )

    async def routes(self) -> set[str]:
        return set(self.device_routes)

    async def link_state(self) -> LinkState:
        if self.closed:
            return LinkState(False)
        return LinkState(True, True, frozenset(str(addr.ip) for addr in self.config.addresses))

    def restart(self) -> None:
        """What a wireguard-go restart does: a new device id, no peers, no peer routes;
        then ``on_restart``, as ``UapiDataplane`` calls it."""
        self.device_id = secrets.token_hex(8)
        self.device.clear()
        self.device_routes.clear()
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart("wireguard-go restart")

    def close(self) -> None:
        """What leaving the device does: peers and routes go; the unreachable
        routes stay (fail closed, as ``link.remove_link``)."""
        self.closed = True
        self.device.clear()
        self.device_routes.clear()

    def _assign(self, public_key: str, allowed_ips: Iterable[str]) -> None:
        """Replace a peer's allowed IPs, taking each from whichever peer held it."""
        wanted = {str(ip_network(ip, strict=False)) for ip in allowed_ips}
        for key, peer in self.device.items():
            if key != public_key and wanted & set(peer.allowed_ips):
                kept = tuple(ip for ip in peer.allowed_ips if ip not in wanted)
                self.device[key] = replace(peer, allowed_ips=kept)
        self.device[public_key] = replace(
            self.device[public_key], allowed_ips=tuple(sorted(wanted))
        )


def _public_keys(plan: Plan) -> list[str]:
    return [
        *(p.public_key for p in plan.remove),
        *(u.public_key for u in plan.update),
        *(p.public_key for p in plan.add),
    ]


@asynccontextmanager
async def open_fake_dataplane(config: DeviceConfig) -> AsyncIterator[FakeDataplane]:
    """A ``FakeDataplane`` for the block; closed on exit like a real device."""
    dataplane = FakeDataplane(config)
    try:
        yield dataplane
    finally:
        dataplane.close()
