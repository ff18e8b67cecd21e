"""The ``NETLINK_ROUTE`` request socket every write of a link, an address or a route
goes through, on the event loop, in whichever network namespace is asked.

What a launcher waits on is the rank's address on the link, and pyroute2's
``IPRoute`` is the costliest thing on that path: its modules (an asyncio core,
traffic-control and mock modules among them) take about 35 ms of CPU to import,
and each ``IPRoute`` opened in a worker thread more (docs/architecture.md,
"Start-up"). The writes are a handful of fixed requests, so they are packed with
``struct`` (``rtnetlink_wire``) and sent here, one at a time, each answered within
a bound; ``route_socket`` sends the peers' routes over a socket of its own, many
in flight.

``open_netlink_socket`` opens the socket in the daemon's own namespace
(``netns=None``) or in a named one (``/run/netns/NAME``, through
``pyroute2.netns.create_socket``, as ``wg_netlink.WgSocket`` does for generic
netlink): that is the only difference; every request after it is the same code,
so the contract suite (which names a namespace) runs the daemon's path.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from vnetd.dataplane.codec.netlink_wire import ERRNO, HEADER, NLMSG_DONE, NLMSG_ERROR, messages
from vnetd.dataplane.codec.rtnetlink_wire import (
    RT_TABLE_MAIN,
    RTM_NEWLINK,
    Address,
    Network,
    Route,
    delete_address,
    delete_link,
    get_link,
    link_index,
    link_up,
    mtu_lock_route,
    new_address,
    new_wireguard_link,
    parse_route,
    route_dump,
    unreachable_route,
)
from vnetd.errors import DataplaneError

LINK_TIMEOUT = 5.0  # one request and its answer, a dump included (invariant 8)


def _socket_in(netns: str) -> socket.socket:
    from vnetd.dataplane.rtnetlink.pyroute2_package import defer_package_init

    defer_package_init()
    from pyroute2.netns import create_socket

    # flags=0: never create the namespace (pyroute2's default is O_CREAT).
    sock: socket.socket = create_socket(
        netns, socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE, flags=0
    )
    return sock


async def open_netlink_socket(netns: str | None) -> trio.socket.SocketType:
    """A ``NETLINK_ROUTE`` socket in ``netns``, or in our own namespace for None.

    Raises:
        OSError: the namespace is not there (FileNotFoundError), or no socket.
    """
    if netns is None:
        return trio.socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    sock = await trio.to_thread.run_sync(_socket_in, netns, abandon_on_cancel=True)
    return trio.socket.from_stdlib_socket(sock)


class LinkSocket:
    """One ``NETLINK_ROUTE`` request socket; open it with ``open_link_socket``.

    Each call sends one request and waits, at most ``timeout`` s, for its answer.
    """

    def __init__(self, sock: trio.socket.SocketType, timeout: float = LINK_TIMEOUT) -> None:
        self.timeout = timeout
        self._socket = sock
        self._sequence = 0

    def close(self) -> None:
        self._socket.close()

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    async def request(self, data: bytes, what: str) -> int:
        """Send one request; the errno of its acknowledgement (0: done).

        Raises:
            DataplaneError: no answer within ``timeout`` s, or the socket failed.
        """
        kind, payload = (await self._exchange(data, what, NLMSG_ERROR))[-1]
        code: int = -ERRNO.unpack_from(payload)[0]
        return code

    async def dump(self, data: bytes, what: str) -> list[bytes]:
        """Send one dump request; the payloads of its messages, up to NLMSG_DONE.

        Raises:
            DataplaneError: the kernel refused, gave no answer in time, or the socket failed.
        """
        found: list[bytes] = []
        for kind, payload in await self._exchange(data, what, NLMSG_DONE):
            if kind == NLMSG_ERROR:
                code = -ERRNO.unpack_from(payload)[0]
                raise DataplaneError(f"netlink: {what}: {os.strerror(code)}")
            if kind != NLMSG_DONE:
                found.append(payload)
        return found

    async def _exchange(self, data: bytes, what: str, last: int) -> list[tuple[int, bytes]]:
        """Send ``data``; ``(type, payload)`` of the messages answering it, up to the first
        of type ``last`` or an error."""
        sequence = HEADER.unpack_from(data)[3]
        answers: list[tuple[int, bytes]] = []
        try:
            with trio.fail_after(self.timeout):
                await self._socket.send(data)
                while True:
                    for kind, _, seq, payload in messages(await self._socket.recv(65536)):
                        if seq != sequence:
                            continue
                        answers.append((kind, payload))
                        if kind in (last, NLMSG_ERROR):
                            return answers
        except trio.TooSlowError:
            raise DataplaneError(f"netlink: {what}: no answer within {self.timeout:g} s") from None
        except OSError as exc:
            raise DataplaneError(f"netlink: {what}: {exc.strerror or exc}") from exc

    def _check(self, code: int, what: str, ignored: tuple[int, ...] = ()) -> None:
        if code and code not in ignored:
            raise DataplaneError(f"netlink: {what}: {os.strerror(code)}")

    async def link_index(self, name: str) -> int | None:
        """The index of the link called ``name``, None when there is none."""
        kind, payload = (await self._exchange(get_link(name, self._next()), name, RTM_NEWLINK))[-1]
        if kind == RTM_NEWLINK:
            return link_index(payload)
        code = -ERRNO.unpack_from(payload)[0]
        self._check(code, f"link {name}", (errno.ENODEV,))
        return None

    async def create_wireguard_link(self, name: str) -> int:
        """Create an in-kernel WireGuard link called ``name``; its index.

        Raises:
            DataplaneError: the kernel refused (``EOPNOTSUPP``: no WireGuard module).
        """
        refused = await self._new_wireguard_link(name)
        if refused is not None:
            raise DataplaneError(f"netlink: {name}: {refused}")
        index = await self.link_index(name)
        if index is None:
            raise DataplaneError(f"netlink: {name}: gone right after it was created")
        return index

    async def wireguard_link_refused(self, name: str) -> str | None:
        """Why a WireGuard link cannot be created here, or None when it can: creates
        ``name`` and deletes it again at once."""
        refused = await self._new_wireguard_link(name)
        if refused is None:
            await self.delete_link(name)
        return refused

    async def _new_wireguard_link(self, name: str) -> str | None:
        code = await self.request(new_wireguard_link(name, self._next()), "wireguard link")
        if not code:
            return None
        hint = " (no wireguard kernel module)" if code == errno.EOPNOTSUPP else ""
        return f"creating a wireguard link: {os.strerror(code)}{hint}"

    async def delete_link(self, name: str) -> bool:
        """Delete the link called ``name``; whether it was there."""
        code = await self.request(delete_link(name, self._next()), f"link delete {name}")
        self._check(code, f"link delete {name}", (errno.ENODEV,))
        return code == 0

    async def add_address(self, index: int, addr: Address, prefixlen: int, flags: int) -> int:
        """Add ``addr`` to the link; the errno (EEXIST: it was there)."""
        request = new_address(index, addr, prefixlen, flags, self._next())
        return await self.request(request, f"address {addr.ip}/{prefixlen}")

    async def delete_address(self, index: int, addr: Address, prefixlen: int) -> None:
        """Delete ``addr``/``prefixlen`` from the link; no error when it is gone."""
        what = f"address delete {addr.ip}/{prefixlen}"
        code = await self.request(delete_address(index, addr, prefixlen, self._next()), what)
        self._check(code, what, (errno.EADDRNOTAVAIL,))

    async def set_link_up(self, index: int, mtu: int) -> None:
        code = await self.request(link_up(index, mtu, self._next()), "link up")
        self._check(code, f"link mtu {mtu} up")

    async def routes_to(self, network: Network) -> list[Route]:
        """The main table's routes to exactly ``network``."""
        family = socket.AF_INET6 if network.version == 6 else socket.AF_INET
        found = []
        for payload in await self.dump(route_dump(family, self._next()), "route dump"):
            route = parse_route(payload)
            if (route.dst, route.dst_len, route.table) == (
                str(network.network_address), network.prefixlen, RT_TABLE_MAIN):  # fmt: skip
                found.append(route)
        return found

    async def route_unreachable(self, network: Network) -> None:
        code = await self.request(unreachable_route(network, self._next()), "route replace")
        self._check(code, f"route unreachable {network}")

    async def lock_route_mtu(self, destination: str, index: int, mtu: int) -> None:
        """``ip route change DESTINATION dev INDEX proto static mtu lock MTU``.

        Raises:
            DataplaneError: the route is not there (ENOENT/ESRCH), or no answer.
        """
        what = f"route change {destination} mtu lock {mtu}"
        code = await self.request(mtu_lock_route(destination, index, mtu, self._next()), what)
        self._check(code, what)


@asynccontextmanager
async def open_link_socket(
    netns: str | None = None,
    timeout: float = LINK_TIMEOUT,  # noqa: ASYNC109 (the bound of each request)
) -> AsyncIterator[LinkSocket]:
    """A ``LinkSocket`` in ``netns`` (None: our own), closed on exit; each request, and
    the opening, bounded by ``timeout`` s.

    Raises:
        DataplaneError: the socket could not be opened in time.
        OSError: the namespace is not there.
    """
    with trio.move_on_after(timeout) as opening:
        sock = await open_netlink_socket(netns)
    if opening.cancelled_caught:
        raise DataplaneError(f"netlink: no socket in {netns} within {timeout:g} s")
    link = LinkSocket(sock, timeout)
    try:
        yield link
    finally:
        link.close()
