"""The kernel data plane: an in-kernel WireGuard link, configured over generic netlink.

The link is created through rtnetlink (``kind wireguard``); key, port and
peers go through WireGuard's generic netlink family (``wg_netlink``): a plan's
peer changes in as few ``WG_CMD_SET_DEVICE`` messages as fit (never
``replace_peers``), all in one worker-thread batch. The link itself, its address,
MTU and routes are ``vnetd.dataplane.rtnetlink.link``'s and ``linked_device``'s (rtnetlink,
one write path), shared with the userspace data plane.

What each change sends is built by pure functions (``device_attrs``,
``peer_messages``, ``handshake_messages``), packed by ``wg_netlink.set_requests``
and the dumps read by ``wg_netlink.parse_dump``, so they are unit-tested
without a kernel; the client is injected (``WgClient``).

A link left by a daemon that was killed (the kernel keeps it, unlike a
wireguard-go that dies with its pod) is adopted when it holds our private key:
its peers and sessions are kept. A link of that name with another key, or of
another kind, is refused and left untouched.
"""

from __future__ import annotations

import base64
import hmac
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from ipaddress import ip_address
from typing import Any, Protocol, TypeVar

import trio

from vnetd.dataplane.base import DeviceConfig, handshake_keepalives, keepalive_of, key_to_hex
from vnetd.dataplane.kernel.wg_netlink import DeviceState, WgSocket, parse_dump
from vnetd.dataplane.rtnetlink.link import (
    create_wireguard_link,
    kernel_unavailable,
    remove_link,
    set_up_link,
)
from vnetd.dataplane.rtnetlink.link_reads import (
    NETLINK_TIMEOUT,
    ROUTE_ALLOWANCE,
    link_kind,
    run_netlink,
)
from vnetd.dataplane.rtnetlink.linked_device import LinkedDevice
from vnetd.dataplane.rtnetlink.pyroute2_package import NetlinkError
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Plan

__all__ = [
    "KernelDataplane",
    "PeerMessage",
    "WgClient",
    "WgFactory",
    "device_attrs",
    "handshake_messages",
    "kernel_unavailable",
    "open_kernel_dataplane",
    "open_wireguard",
    "parse_dump",
    "peer_messages",
    "split_endpoint",
]

log = logging.getLogger("vnetd.dataplane")

CLEANUP_DEADLINE = 10.0
SET_ALLOWANCE = 0.15
"""Seconds of the plan's netlink bound per peer change beyond ``NETLINK_TIMEOUT``: one
takes microseconds of the kernel's time on a node; in the TCG guest at a load of 90
on 2 cores, sent one message each through pyroute2, an add took 37 ms and a removal
58 ms, so 1000 of them get 155 s in all (packed many to a message, 1000 adds took
6.1 s and 1000 removals 8.4 s there at a load of 9). One fixed 5 s bound failed a
1000-peer plan there, every retry alike."""
DUMP_ALLOWANCE = 0.1
"""Seconds of a dump's netlink bound per peer beyond ``NETLINK_TIMEOUT``, for the peers
the device holds as far as this data plane knows (``KernelDataplane.known_peers``):
pyroute2 decoded a dump at 27-44 ms a peer in that loaded guest (25-44 s for 1000; the
fixed 5 s bound failed them). ``wg_netlink.parse_dump`` is much cheaper; the allowance
is kept for a loaded guest's worst case."""

T = TypeVar("T")

PeerMessage = dict[str, Any]
"""A peer change, in the fields of pyroute2's ``WireGuard.set(peer=...)``."""


class WgClient(Protocol):
    """WireGuard's generic netlink, as ``wg_netlink.WgSocket`` speaks it (sync; run in a
    thread)."""

    def set_device(self, interface: str, private_key: str, listen_port: int) -> None: ...

    def set_peers(self, interface: str, peers: Sequence[PeerMessage]) -> None: ...

    def dump(self, interface: str) -> list[bytes]: ...

    def close(self) -> None: ...


WgFactory = Callable[[str | None], WgClient]


def open_wireguard(netns: str | None) -> WgClient:
    """A generic netlink socket on WireGuard's family, in ``netns`` (never created)."""
    return WgSocket(netns)


# --- messages (pure) --------------------------------------------------------------------


def device_attrs(config: DeviceConfig) -> dict[str, Any]:
    """The device-level ``set`` arguments: private key and listen port."""
    key_to_hex(config.private_key, "private_key")
    return {"private_key": config.private_key, "listen_port": config.listen_port}


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4_ENDPOINT = re.compile(rf"({_OCTET}(?:\.{_OCTET}){{3}}):([1-9]\d{{0,4}})")
"""An IPv4 endpoint in normal form: a join writes a thousand, and a match costs about
1 µs where ``ipaddress`` takes 10-20 µs (2 s of a 1000-peer plan in the guest)."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` to ``(host, port)`` as the netlink endpoint wants it."""
    fast = _IPV4_ENDPOINT.fullmatch(endpoint)
    if fast and int(fast[2]) < 65536:
        return fast[1], int(fast[2])
    host, _, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ip_address(host)), int(port)
    except ValueError:
        raise DataplaneError(f"endpoint: {endpoint!r} is not IP:PORT") from None


def _endpoint_fields(endpoint: str | None) -> dict[str, Any]:
    if endpoint is None:
        return {}
    addr, port = split_endpoint(endpoint)
    return {"endpoint_addr": addr, "endpoint_port": port}


def peer_messages(
    plan: Plan, persistent_keepalive: int = 0, preshared_key: str | None = None
) -> list[PeerMessage]:
    """One message per peer change of ``plan``: removes, then updates, then adds.

    The same semantics as the UAPI lines: updates are ``update_only``; adds
    replace the peer's allowed IPs, so re-adding an existing peer is exact; a
    peer whose handshake the plan starts is added with its keepalive off (its
    ``handshake_messages`` turn it on once the routes are in).
    """
    messages: list[PeerMessage] = []
    started = set(plan.handshake)
    for peer in plan.remove:
        messages.append({"public_key": _key(peer.public_key), "remove": True})
    for upd in plan.update:
        msg: PeerMessage = {"public_key": _key(upd.public_key), "update_only": True}
        msg.update(_endpoint_fields(upd.endpoint))
        if upd.allowed_ips is not None:
            msg["replace_allowed_ips"] = True
            msg["allowed_ips"] = list(upd.allowed_ips)
        messages.append(msg)
    for peer in plan.add:
        msg = {"public_key": _key(peer.public_key)}
        if preshared_key is not None:
            msg["preshared_key"] = _key(preshared_key)
        msg.update(_endpoint_fields(None if peer.endpoint_held else peer.endpoint))
        msg["replace_allowed_ips"] = True
        msg["allowed_ips"] = list(peer.allowed_ips)
        keepalive = keepalive_of(peer, persistent_keepalive)
        if keepalive and peer.public_key not in started:
            msg["persistent_keepalive"] = keepalive
        messages.append(msg)
    return messages


def handshake_messages(
    keys: Sequence[str], persistent_keepalive: int = 0, ending: Mapping[str, int] | None = None
) -> list[PeerMessage]:
    """Messages that make the kernel start a handshake with each peer now.

    As in wireguard-go, a persistent keepalive going from off to on sends a
    keepalive at once (``wg_packet_send_keepalive`` in the kernel's
    netlink.c), which with no session starts a handshake; each peer's ends at
    its value (``ending``, else ``persistent_keepalive``).
    """
    return [
        {"public_key": _key(key), "update_only": True, "persistent_keepalive": seconds}
        for key in keys
        for seconds in (0, 1, (ending or {}).get(key, persistent_keepalive))
    ]


def _key(key: str) -> str:
    key_to_hex(key)  # a DataplaneError naming public_key, before pyroute2's ValueError
    return key


# --- the data plane ---------------------------------------------------------------------


class KernelDataplane(LinkedDevice):
    """An in-kernel WireGuard link. Create it with ``open_kernel_dataplane``."""

    def __init__(self, config: DeviceConfig, netns: str | None, wg_factory: WgFactory) -> None:
        self.config = config
        self.netns = netns
        self.wg_factory = wg_factory
        self.index = 0
        self.noprefixroute = True
        self.device_id = secrets.token_hex(8)
        self.owns_link = False
        """Set once the link is ours (created or adopted): removed on exit."""
        self.known_peers = config.max_peers
        """The peers the device may hold, for the bound of a dump: at first the most the
        mesh has (a link adopted from a killed daemon holds them all), then as last
        dumped, moved by each plan."""
        self._lock = trio.Lock()

    def _call(self, fn: Callable[[WgClient], T]) -> T:
        """Open a WireGuard socket, run ``fn`` with it, close it (sync; in a thread).

        Raises:
            DataplaneError: the socket failed (no answer within ``wg_netlink.TIMEOUT``).
        """
        try:
            wg = self.wg_factory(self.netns)
            try:
                return fn(wg)
            finally:
                wg.close()
        except OSError as exc:  # the kernel's refusals are NetlinkError, mapped by run_netlink
            raise DataplaneError(f"netlink: wireguard socket: {exc.strerror or exc}") from exc

    def _info(self) -> DeviceState:
        interface = self.config.interface
        info = parse_dump(self._call(lambda wg: wg.dump(interface)))
        self.known_peers = len(info[2])
        return info

    def _dump_bound(self) -> float:
        """The netlink bound of one dump of the device: it scales with its peers."""
        return NETLINK_TIMEOUT + DUMP_ALLOWANCE * self.known_peers

    async def peers(self) -> dict[str, DevicePeer]:
        async with self._lock:
            peers = (await run_netlink(self._info, self._dump_bound()))[2]
            await self._settle_routes(peers.values())
            return peers

    def _send(self, messages: Sequence[PeerMessage], reread: bool) -> set[str]:
        """Send the messages in order (as few ``set`` s as fit them); then, when asked,
        the allowed IPs live (a whole dump)."""
        interface = self.config.interface
        self._call(lambda wg: wg.set_peers(interface, messages))
        if not reread:
            return set()
        return {ip for peer in self._info()[2].values() for ip in peer.allowed_ips}

    async def apply(self, plan: Plan) -> None:
        """Apply ``plan`` in one netlink batch, then move the routes, then start the
        plan's handshakes in a second batch (``_apply_then_route``).

        The kernel applies the peer changes in order: a refused one leaves the
        earlier ones applied; the next full resync heals it.

        Raises:
            DataplaneError: the kernel refused the change.
        """
        if not plan:
            return
        keepalive = self.config.persistent_keepalive
        messages = peer_messages(plan, keepalive, self.config.preshared_key)
        handshakes = handshake_messages(
            plan.handshake, keepalive, handshake_keepalives(plan, keepalive)
        )
        self.known_peers += len(plan.add)  # an upper bound until the next dump
        bound = NETLINK_TIMEOUT + SET_ALLOWANCE * len(messages)

        def write(reread: bool) -> Awaitable[set[str]]:
            within = bound + (self._dump_bound() if reread else 0.0)
            return run_netlink(lambda: self._send(messages, reread), within)

        def start_handshakes() -> Awaitable[set[str]]:
            within = NETLINK_TIMEOUT + SET_ALLOWANCE * len(handshakes)
            return run_netlink(lambda: self._send(handshakes, False), within)

        await self._apply_then_route(plan, write, start_handshakes if handshakes else None)

    async def open(self) -> bool:
        """Create (or adopt) the link, set key and port, configure the link.

        Returns whether an existing link was adopted.

        Raises:
            DataplaneError: the name belongs to something else, or the kernel refused.
        """
        config, netns = self.config, self.netns
        kind = await run_netlink(lambda: link_kind(netns, config.interface))
        adopted: dict[str, DevicePeer] | None = None
        if kind is None:
            await create_wireguard_link(netns, config.interface)
        elif kind == "wireguard":
            adopted = await self._check_ours()
        self.owns_link = kind in (None, "wireguard")
        if not self.owns_link:
            raise DataplaneError(
                f"interface {config.interface} already exists (kind {kind}): it belongs to "
                f"something else; delete it (ip link del {config.interface}) or choose another "
                "name with [mesh] interface"
            )
        attrs = device_attrs(config)
        await run_netlink(lambda: self._call(lambda wg: wg.set_device(config.interface, **attrs)))
        # set_up_link dumps the namespace's routes (fail_closed.route_unreachable): an
        # adopted link's come with it, one per peer (1000 missed the fixed 5 s in the guest).
        bound = NETLINK_TIMEOUT + ROUTE_ALLOWANCE * config.max_peers
        self.index, self.noprefixroute = await set_up_link(netns, config, bound)
        if adopted is not None:
            await self._repair_adopted(adopted.values())
        return adopted is not None

    async def _check_ours(self) -> dict[str, DevicePeer]:
        interface = self.config.interface
        key, _, peers = await run_netlink(self._info, self._dump_bound())
        if not key or not hmac.compare_digest(
            base64.b64decode(key), base64.b64decode(self.config.private_key)
        ):
            what = "another private key" if key else "no private key"
            raise DataplaneError(
                f"interface {interface}: a kernel wireguard link with {what} already exists: "
                f"it belongs to something else; delete it (ip link del {interface}) or choose "
                "another name with [mesh] interface"
            )
        return peers


@asynccontextmanager
async def open_kernel_dataplane(
    config: DeviceConfig,
    *,
    netns: str | None = None,
    wg_factory: WgFactory = open_wireguard,
) -> AsyncIterator[KernelDataplane]:
    """Create (or adopt) the kernel WireGuard link, configure it, yield the device.

    On exit the link is removed and the unreachable routes are kept (fail
    closed while vnetd is down).

    Args:
        config: the device.
        netns: an existing network namespace (tests only; the daemon runs in
            its pod's namespace with ``None``).
        wg_factory: opens the generic netlink client (a fake in unit tests).

    Raises:
        DataplaneError: the kernel has no WireGuard, refused a setting, or the
            interface name belongs to something else.

    Cancellation: cleanup runs shielded, bounded by ``CLEANUP_DEADLINE``.
    """
    started = trio.current_time()
    dataplane = KernelDataplane(config, netns, wg_factory)
    try:
        adopted = await dataplane.open()
        log.info(
            "%s: kernel wireguard %s in %.0f ms (address %s, mtu %d)",
            config.interface,
            "link adopted (same key)" if adopted else "link up",
            (trio.current_time() - started) * 1000,
            config.describe_addresses(),
            config.mtu,
        )
        yield dataplane
    except NetlinkError as exc:  # from the WireGuard socket outside run_netlink's mapping
        raise DataplaneError(f"netlink: {exc}") from exc
    finally:
        dataplane.close_routes()
        if dataplane.owns_link:
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + CLEANUP_DEADLINE
                try:
                    await remove_link(netns, config, CLEANUP_DEADLINE)
                except DataplaneError as exc:
                    log.error("%s: could not remove link or routes: %s", config.interface, exc)
