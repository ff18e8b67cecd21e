"""The link side both real data planes share, whatever drives WireGuard: the peers'
routes follow every plan, and a link adopted from a previous run is repaired.

Each plan's routes go over the device's one ``route_socket.RouteSocket`` on the
event loop, and so do a repair's (the routes read with pyroute2, then changed
over that socket): one write path, in the daemon's namespace or a test's
(docs/architecture.md, "Data plane and routing").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import ip_network

import trio

from vnetd.dataplane.base import DeviceConfig, LinkState, route_changes
from vnetd.dataplane.rtnetlink.link import prune_addresses
from vnetd.dataplane.rtnetlink.link_reads import (
    NETLINK_TIMEOUT,
    ROUTE_ALLOWANCE,
    device_routes,
    read_link_state,
    run_netlink,
)
from vnetd.dataplane.rtnetlink.route_socket import RouteSocket
from vnetd.model import DevicePeer, Plan

log = logging.getLogger("vnetd.dataplane")


def moves_addresses(plan: Plan) -> bool:
    """Whether ``plan`` removes a peer or changes allowed IPs (routes may have to stay)."""
    return bool(plan.remove) or any(upd.allowed_ips is not None for upd in plan.update)


def _cidr(ip: str) -> str:
    return str(ip_network(ip, strict=False))


class LinkedDevice:
    """What both real data planes do on the link side, whatever drives WireGuard.

    Routes follow the peers' allowed IPs after every change, and a link
    adopted from a previous run is repaired. A subclass sets ``config``,
    ``netns``, ``index`` (once the link is configured) and ``_lock``.
    """

    config: DeviceConfig
    netns: str | None
    index: int
    _lock: trio.Lock
    _route_socket: RouteSocket | None = None
    _routes_unsure = False
    """A change failed part-way: peers may be on the device without their routes."""

    async def _apply_then_route(
        self,
        plan: Plan,
        write: Callable[[bool], Awaitable[set[str]]],
        start_handshakes: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Under the lock: ``write`` the plan to the device, add and delete routes to
        match (``route_changes``), then ``start_handshakes`` (the plan's ``handshake``).

        The handshakes start only once the routes are in: a handshake completes in
        well under a millisecond between two pods, and the peer then sends what it
        held for us at once (a TCP SYN, say); our answer (the SYN-ACK) routed while
        the peer's route is not yet in meets the ``unreachable`` overlay route and is
        dropped, and TCP sends it again a second later (seen in bench/launcher.py:
        one such second for 5 of 31 workers at 32 pods, each counted as
        ``IpOutNoRoutes`` on rank 0).

        ``write(True)`` returns the allowed IPs the device then holds: asked only
        when the plan removes a peer or moves allowed IPs, where a route may have
        to stay for another peer. A plan of adds and endpoint updates takes no
        route away and every IP it adds is live once written, so the device is
        not read back (a read is O(peers), invariant 11).
        """
        async with self._lock:
            start = trio.current_time()
            reread = moves_addresses(plan)
            # Until the routes follow the plan, a failure (or a cancel) may leave peers
            # on the device without theirs: the next read of the peers repairs them.
            self._routes_unsure = True
            live = await write(reread)
            if not reread:
                live = {_cidr(ip) for peer in plan.add for ip in peer.allowed_ips}
            gone, new = route_changes(plan, live)
            if gone or new:
                await self._change_routes(gone, new)
            self._routes_unsure = False
            if start_handshakes is not None:
                await start_handshakes()
            elapsed = (trio.current_time() - start) * 1000
        log.debug(
            "%s: applied %s (routes -%d +%d) in %.1f ms",
            self.config.interface,
            plan.describe(limit=16),
            len(gone),
            len(new),
            elapsed,
        )

    async def _change_routes(self, gone: set[str], new: set[str]) -> None:
        """Over the device's one long-lived netlink socket on the event loop."""
        self._route_socket = self._route_socket or RouteSocket(self.netns)  # at first use
        await self._route_socket.change(self.index, gone, new)

    def close_routes(self) -> None:
        """Close the route socket (when the device is closed)."""
        if self._route_socket is not None:
            self._route_socket.close()
            self._route_socket = None

    async def routes(self) -> set[str]:
        async with self._lock:
            netns, index = self.netns, self.index
            return await run_netlink(lambda: device_routes(netns, index))

    async def link_state(self) -> LinkState:
        netns, interface = self.netns, self.config.interface
        return await run_netlink(lambda: read_link_state(netns, interface))

    async def _repair_adopted(self, peers: Iterable[DevicePeer]) -> None:
        """An adopted link: only our addresses, and a route per peer exactly."""
        interface = self.config.interface
        keep = [str(addr.ip) for addr in self.config.addresses]
        stale = await prune_addresses(self.netns, self.index, keep)
        if stale:
            log.warning("%s: removed addresses of a previous run: %s", interface, ",".join(stale))
        await self._sync_routes(peers)

    async def _settle_routes(self, peers: Iterable[DevicePeer]) -> None:
        """After a change that failed part-way (``_routes_unsure``), the routes made
        exactly the allowed IPs of ``peers``, the device as just read (invariant 9):
        a ``set`` refused or timed out may have put peers on the device whose routes
        were never added, and a pass that finds them there plans nothing for them."""
        if self._routes_unsure:
            await self._sync_routes(peers)
            self._routes_unsure = False

    async def _sync_routes(self, peers: Iterable[DevicePeer]) -> None:
        """Make the device's routes exactly the allowed IPs of ``peers`` (for a device
        adopted from a previous run, whose routes may have been changed meanwhile)."""
        interface, index, netns = self.config.interface, self.index, self.netns
        held = {str(ip_network(ip, strict=False)) for p in peers for ip in p.allowed_ips}
        bound = NETLINK_TIMEOUT + ROUTE_ALLOWANCE * len(held)  # a repair may read them all
        have = await run_netlink(lambda: device_routes(netns, index), bound)
        gone, new = have - held, held - have
        if gone or new:
            await self._change_routes(gone, new)
            log.info(
                "%s: peer routes repaired (-%s +%s)",
                interface,
                ",".join(sorted(gone)) or "none",
                ",".join(sorted(new)) or "none",
            )
