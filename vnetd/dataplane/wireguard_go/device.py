"""The userspace data plane: wireguard-go, configured over its UAPI socket.

The UAPI client is ``vnetd.dataplane.wireguard_go.uapi_client``'s and the line formats
``vnetd.dataplane.codec.uapi_protocol``'s (both re-exported here); starting,
adopting and watching the wireguard-go process is
``vnetd.dataplane.wireguard_go.supervise``'s; the link, its address and the routes are
``vnetd.dataplane.rtnetlink.link``'s and ``vnetd.dataplane.rtnetlink.linked_device``'s. This module
puts them together: it adopts or starts the device, applies plans, and restarts
wireguard-go when it dies.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from functools import partial

import trio

from vnetd.dataplane.base import DeviceConfig, handshake_keepalives, key_to_hex
from vnetd.dataplane.codec.uapi_protocol import (
    SOCKET_DIR,
    parse_peers,
    plan_lines,
    socket_path,
    split_plan,
)
from vnetd.dataplane.rtnetlink.link import remove_link, set_up_link
from vnetd.dataplane.rtnetlink.link_reads import existing_link_kind
from vnetd.dataplane.rtnetlink.linked_device import LinkedDevice
from vnetd.dataplane.wireguard_go.supervise import (
    STOP_GRACE,
    RestartBudget,
    SocketProbe,
    WireguardGo,
    device_id_path,
    output_path,
    probe_socket,
    read_device_id,
    remove_stale,
    start_wireguard_go,
    write_device_id,
)
from vnetd.dataplane.wireguard_go.uapi_client import SEND_ALLOWANCE, UAPI_TIMEOUT, UapiClient
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer, Plan

log = logging.getLogger("vnetd.dataplane")

__all__ = [
    "SOCKET_DIR",
    "UAPI_TIMEOUT",
    "RestartBudget",
    "UapiClient",
    "UapiDataplane",
    "open_uapi_dataplane",
    "parse_peers",
    "plan_lines",
]

CLEANUP_DEADLINE = STOP_GRACE + 5.0


# --- the data plane ---------------------------------------------------------------------


class UapiDataplane(LinkedDevice):
    """A running wireguard-go device. Create it with ``open_uapi_dataplane``.

    ``process`` is the wireguard-go serving it, replaced when it dies and is
    restarted; ``on_restart`` (set by the daemon) is then called with the
    reason, so the owner of the desired state re-applies it. Calls made while
    a restart is under way wait for it (it is bounded).
    """

    def __init__(
        self,
        config: DeviceConfig,
        uapi: UapiClient,
        netns: str | None,
        process: WireguardGo,
        wireguard_go: str = "wireguard-go",
    ) -> None:
        self.config = config
        self.uapi = uapi
        self.netns = netns
        self.process = process
        self.wireguard_go = wireguard_go
        self.index = 0
        self.noprefixroute = True
        self.restarts = 0
        self.on_restart: Callable[[str], None] | None = None
        self._lock = trio.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def device_id(self) -> str:
        """This device instance's id: new at each fresh start of wireguard-go (a
        restart included), kept when a running one is adopted."""
        return self.process.device_id

    async def peers(self) -> dict[str, DevicePeer]:
        async with self._lock:
            peers = parse_peers(await self.uapi.get())
            await self._settle_routes(peers.values())
            return peers

    async def apply(self, plan: Plan) -> None:
        """Apply ``plan`` as UAPI ``set`` transactions of at most ``MAX_ADDS_PER_SET``
        adds each (``split_plan``), each followed by its routes and then by a ``set``
        that starts its handshakes (``_apply_then_route``).

        Each ``set`` may take ``SEND_ALLOWANCE`` s longer per peer it adds.
        wireguard-go applies the lines in order and stops at the first error,
        so a refused transaction may be partly applied, and the transactions
        before it stay applied; the next pass (a full one) heals it.

        Raises:
            DataplaneError: the device or the kernel refused the change.
        """
        if not plan:
            return
        keepalive = self.config.persistent_keepalive
        for part in split_plan(plan):
            lines = plan_lines(part, keepalive, self.config.preshared_key)
            ending = handshake_keepalives(part, keepalive)
            handshakes = handshake_lines(part.handshake, keepalive, ending)
            within = self.uapi.timeout + SEND_ALLOWANCE * len(part.add)
            handshakes_within = self.uapi.timeout + SEND_ALLOWANCE * len(part.handshake)
            await self._apply_then_route(
                part,
                partial(self._set, lines, within),
                partial(self._set, handshakes, handshakes_within, False) if handshakes else None,
            )

    async def _set(self, lines: list[tuple[str, str]], within: float, reread: bool) -> set[str]:
        """``set`` (bounded by ``within`` s); then, when asked, the allowed IPs the device
        holds (a whole ``get``)."""
        await self.uapi.set(lines, within)
        if not reread:
            return set()
        return {ip for p in parse_peers(await self.uapi.get()).values() for ip in p.allowed_ips}

    async def configure(self, device: list[tuple[str, str]] | None) -> None:
        """Key and port, then the link: address, MTU, up, the unreachable route.

        Args:
            device: the ``get`` lines of an adopted device, None for a new
                one. An adopted device keeps its key (it is ours) and its port
                unless the port differs (setting it rebinds the socket), and
                gets a route per peer exactly.
        """
        config = self.config
        if device is None:
            await self.uapi.set(
                [
                    ("private_key", key_to_hex(config.private_key, "private_key")),
                    ("listen_port", str(config.listen_port)),
                ]
            )
        elif dict(device).get("listen_port") != str(config.listen_port):
            await self.uapi.set([("listen_port", str(config.listen_port))])
        self.index, self.noprefixroute = await set_up_link(self.netns, config)
        if device is not None:
            await self._repair_adopted(parse_peers(device).values())

    async def supervise(self, budget: RestartBudget) -> None:
        """Restart wireguard-go whenever it exits, within ``budget``.

        The first restart holds the lock from the moment the exit is seen, so
        device calls wait for the new device rather than fail; during a later
        back-off they fail (and the reconciler retries).

        Raises:
            DataplaneError: the budget is spent (it keeps dying).
        """
        interface = self.config.interface
        while True:
            code = await self.process.wait()
            died = trio.current_time()
            line = self.process.last_line() or "(no output)"
            shown = "unknown (not our child)" if code is None else str(code)
            reason = f"wireguard-go pid {self.process.pid} exited with code {shown}: {line}"
            while True:
                delay = budget.next_delay(trio.current_time())
                if delay is None:
                    raise DataplaneError(
                        f"wireguard-go for {interface} exited {budget.limit} times within "
                        f"{budget.window:g} s; giving up. Last: {reason}"
                    )
                log.warning(
                    "%s: %s; restarting%s", interface, reason, f" in {delay:.1f} s" if delay else ""
                )
                if delay:
                    await trio.sleep(delay)
                async with self._lock:
                    failure = await self._replace_process()
                if failure is None:
                    break
                reason = failure
            self.restarts += 1
            log.info(
                "%s: wireguard-go restarted as pid %d in %.0f ms (device id %s); "
                "re-applying the peers",
                interface,
                self.process.pid,
                (trio.current_time() - died) * 1000,
                self.device_id,
            )
            if self.on_restart is not None:
                self.on_restart("wireguard-go restart")

    async def _replace_process(self) -> str | None:
        """Start and configure a new wireguard-go (the lock is held); why it failed, or None."""
        self.uapi.close()  # its connection was to the one that exited
        self.process.close()
        remove_stale(socket_path(self.config.interface))
        try:
            config = self.config
            self.process = await start_wireguard_go(
                config.interface, self.netns, self.wireguard_go, config.wireguard_log,
                config.child_env,
            )  # fmt: skip
        except DataplaneError as exc:
            return f"restart failed: {exc}"
        try:
            await self.configure(None)
        except DataplaneError as exc:
            await self.process.stop()
            return f"restarted wireguard-go pid {self.process.pid} not configured: {exc}"
        return None


def handshake_lines(
    keys: Sequence[str], persistent_keepalive: int = 0, ending: Mapping[str, int] | None = None
) -> list[tuple[str, str]]:
    """``set`` lines that make wireguard-go start a handshake with each peer now.

    The UAPI has no "handshake" command, but wireguard-go sends a keepalive at
    once when a peer's persistent keepalive goes from off to on, and with no
    session that keepalive starts a handshake (checked here with wireguard-go
    0.0.20220316). So each peer's is turned off, on, and back to its value
    (``ending``, else ``persistent_keepalive``), in a ``set`` of their own once
    the plan's peers and routes are in.
    """
    lines: list[tuple[str, str]] = []
    for key in keys:
        hexkey = key_to_hex(key)
        for seconds in (0, 1, (ending or {}).get(key, persistent_keepalive)):
            lines += [("public_key", hexkey), ("update_only", "true")]
            lines.append(("persistent_keepalive_interval", str(seconds)))
    return lines


# --- adopt or start ---------------------------------------------------------------------

_FIX = "stop it or choose another name with [mesh] interface"


async def adopt_or_start(
    config: DeviceConfig, netns: str | None, wireguard_go: str
) -> tuple[WireguardGo, list[tuple[str, str]] | None]:
    """The wireguard-go for ``config.interface``: the one already serving it with
    our key (adopted, with its ``get`` lines), or a new one (with None).

    Raises:
        DataplaneError: the name belongs to something else: a wireguard-go
            with another key, or a link of another kind. Nothing is touched.
    """
    interface = config.interface
    found = await probe_socket(interface)
    if found.state == "answers":
        try:
            device = await _check_ours(config, netns, found)
            assert found.process is not None
            # Adopted: the device id of its start. None from an older vnetd: a new one.
            found.process.device_id = read_device_id(interface) or write_device_id(interface)
        except BaseException:
            if found.process is not None:
                found.process.close()
            raise
        return found.process, device
    if found.state == "stale":
        remove_stale(found.path)
        log.info("%s: removed stale socket %s (no wireguard-go behind it)", interface, found.path)
    kind = await existing_link_kind(netns, interface)
    if kind is not None:
        # A tun is likely a wireguard-go whose socket this mount namespace does
        # not see (/run/wireguard not shared with the previous container).
        owner = "something else"
        if kind == "tun":
            owner = "another program, or a wireguard-go whose socket is not visible here"
        raise DataplaneError(
            f"interface {interface} already exists (kind {kind}) and no wireguard-go answers "
            f"on {found.path}: it belongs to {owner}; delete it "
            f"(ip link del {interface}) or choose another name with [mesh] interface"
        )
    started = await start_wireguard_go(
        interface, netns, wireguard_go, config.wireguard_log, config.child_env
    )
    return started, None


async def _check_ours(
    config: DeviceConfig, netns: str | None, found: SocketProbe
) -> list[tuple[str, str]]:
    """The device's ``get`` lines when it is ours to adopt; else ``DataplaneError``."""
    interface, path = config.interface, found.path
    device = await UapiClient(path).get()
    key = dict(device).get("private_key", "")
    ours = key_to_hex(config.private_key, "private_key")
    served = f"interface {interface}: {path} is served by wireguard-go pid {found.pid}"
    if not hmac.compare_digest(key, ours):
        what = "another private key" if key else "no private key"
        raise DataplaneError(f"{served} with {what}: it belongs to something else; {_FIX}")
    if found.process is None:
        raise DataplaneError(
            f"interface {interface}: {path} is served with this rank's key by a wireguard-go "
            "in another PID namespace, which cannot be supervised from here; stop it, or "
            "share the pod's process namespace"
        )
    kind = await existing_link_kind(netns, interface)
    if kind != "tun":
        there = "no link" if kind is None else f"a {kind} link"
        raise DataplaneError(
            f"{served} with this rank's key, but this network namespace has {there} "
            f"named {interface}; {_FIX}"
        )
    return device


async def _stop(process: WireguardGo, config: DeviceConfig, netns: str | None) -> None:
    """Stop wireguard-go (ours or adopted alike); remove what it leaves behind."""
    await process.stop()
    interface = config.interface
    for leftover in (socket_path(interface), output_path(interface), device_id_path(interface)):
        with suppress(FileNotFoundError):
            os.unlink(leftover)
    try:
        # Bounded by the caller's cleanup deadline; a loaded machine can take
        # more than NETLINK_TIMEOUT to enter a namespace here.
        await remove_link(netns, config, timeout=CLEANUP_DEADLINE)
    except DataplaneError as exc:
        log.error("%s: could not remove link or routes: %s", config.interface, exc)


@asynccontextmanager
async def open_uapi_dataplane(
    config: DeviceConfig,
    *,
    netns: str | None = None,
    wireguard_go: str = "wireguard-go",
    restarts: RestartBudget | None = None,
) -> AsyncIterator[UapiDataplane]:
    """Start (or adopt) wireguard-go for ``config.interface``, configure it, yield the device.

    A wireguard-go already serving the interface with our private key (left
    by a daemon that was killed) is adopted as it is: its peers and sessions
    are kept, the link is checked and the peer routes repaired. A wireguard-go
    with another key, or a link of another kind with that name, is refused
    and left untouched.

    While the block runs, a wireguard-go that exits is restarted (at once,
    then backing off, within ``restarts``: by default 5 within 60 s) and
    ``UapiDataplane.on_restart`` is called; once the budget is spent the block
    is cancelled and ``DataplaneError`` raised. On exit wireguard-go, ours or
    adopted, gets SIGTERM, then SIGKILL after 5 s; the link is removed and the
    unreachable routes are kept (fail closed while vnetd is down).

    Args:
        config: the device.
        netns: run the device in this existing network namespace (tests only;
            the daemon runs inside its pod's namespace with ``None``).
        wireguard_go: the wireguard-go executable.
        restarts: the restart budget.

    Raises:
        DataplaneError: the interface belongs to something else, or
            wireguard-go could not start, be configured, or keeps dying.

    Cancellation: cleanup runs shielded, bounded by ``CLEANUP_DEADLINE``.
    """
    started = trio.current_time()
    process, device = await adopt_or_start(config, netns, wireguard_go)
    uapi = UapiClient(socket_path(config.interface), keep_open=True)
    dataplane = UapiDataplane(config, uapi, netns, process, wireguard_go)
    try:
        async with trio.open_nursery() as nursery:
            await dataplane.configure(device)
            elapsed = (trio.current_time() - started) * 1000
            if device is None:
                how = f"wireguard-go pid {process.pid} up"
            else:
                kept = len(parse_peers(device))
                how = f"adopted running wireguard-go pid {process.pid} (same key, {kept} peer(s))"
            log.info(
                "%s: %s in %.0f ms (address %s, mtu %d, device id %s)",
                config.interface,
                how,
                elapsed,
                config.address,
                config.mtu,
                dataplane.device_id,
            )
            nursery.start_soon(dataplane.supervise, restarts or RestartBudget())
            try:
                yield dataplane
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        dataplane.close_routes()
        dataplane.uapi.close()
        with trio.CancelScope(shield=True) as cleanup:
            cleanup.deadline = trio.current_time() + CLEANUP_DEADLINE
            await _stop(dataplane.process, config, netns)
        if cleanup.cancelled_caught:
            log.error(
                "%s: cleanup did not finish within %g s (pid %d)",
                config.interface,
                CLEANUP_DEADLINE,
                dataplane.pid,
            )
