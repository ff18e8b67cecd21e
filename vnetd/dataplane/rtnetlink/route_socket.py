"""The peers' host routes, changed over one long-lived trio netlink socket.

A join's pass adds one /32 (/128) route (invariant 9). Through pyroute2's sync
``IPRoute`` that was a worker thread and a new ``IPRoute`` per change (an
asyncio loop, a socketpair and an epoll each): about 2 ms of CPU and two
thread wake-ups, which on loaded cores cost a pass tens of ms of wall time.
Here each change is one netlink request (``rtnetlink_wire.route_message``: an
add with the fields pyroute2's ``route("add", dst=, oif=)`` sends, a delete with
those of ``ip route del``; a unit test compares the bytes with pyroute2's
``rtmsg``), written to a non-blocking ``NETLINK_ROUTE`` socket on the event loop,
many in flight, and the kernel's acknowledgements are read back. The socket is
opened in the device's namespace (``link_socket.open_netlink_socket``: the
daemon's own, or a named one for the tests), the same code after that; see
docs/architecture.md, "Data plane and routing".
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

import trio

from vnetd.dataplane.codec.netlink_wire import acknowledgements
from vnetd.dataplane.codec.rtnetlink_wire import route_message
from vnetd.dataplane.rtnetlink.link_socket import open_netlink_socket
from vnetd.errors import DataplaneError

ROUTE_TIMEOUT = 5.0  # one batch of route changes (invariant 8), plus REQUEST_ALLOWANCE each
REQUEST_ALLOWANCE = 0.01
"""Seconds more of a batch's bound per route: 1000 took 5.3 s in the TCG guest at a load
of 90 on 2 cores (a fixed 5 s bound failed them), about 50 ms on a node."""
WINDOW = 64  # requests in flight before their acknowledgements are read
_IGNORED_ON_ADD = (errno.EEXIST,)
_IGNORED_ON_DEL = (errno.ESRCH, errno.ENOENT)


class RouteSocket:
    """One ``NETLINK_ROUTE`` socket in ``netns`` (None: the daemon's own namespace),
    opened at first use."""

    def __init__(self, netns: str | None = None, timeout: float = ROUTE_TIMEOUT) -> None:
        self.netns = netns
        self.timeout = timeout
        """The bound of a batch, beyond ``REQUEST_ALLOWANCE`` per route in it."""
        self._socket: trio.socket.SocketType | None = None
        self._sequence = 0
        self._lock = trio.Lock()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def change(self, index: int, gone: Iterable[str], new: Iterable[str]) -> None:
        """Delete the routes to ``gone`` and add routes via link ``index`` for ``new``
        (CIDRs), in that order; idempotent (a route already there, or already gone,
        is no error).

        Raises:
            DataplaneError: the kernel refused a change, or gave no answer in time.
        """
        requests = [("del", dst) for dst in sorted(gone)] + [("add", dst) for dst in sorted(new)]
        if not requests:
            return
        bound = self.timeout + REQUEST_ALLOWANCE * len(requests)
        async with self._lock:
            try:
                with trio.fail_after(bound):
                    await self._exchange(index, requests)
            except trio.TooSlowError:
                self.close()  # late answers must not be read as the next batch's
                raise DataplaneError(
                    f"netlink: no answer within {bound:g} s to the route changes"
                ) from None
            except OSError as exc:
                self.close()
                raise DataplaneError(f"netlink: {exc.strerror or exc}") from exc

    async def _exchange(self, index: int, requests: list[tuple[str, str]]) -> None:
        # At most WINDOW requests in flight: the kernel acknowledges each as it is
        # sent, and acknowledgements beyond the receive buffer (about 270 of them at
        # the default 208 KiB) are dropped and fail the socket with ENOBUFS.
        for start in range(0, len(requests), WINDOW):
            await self._exchange_window(index, requests[start : start + WINDOW])

    async def _exchange_window(self, index: int, requests: list[tuple[str, str]]) -> None:
        sock = await self._open()
        pending: dict[int, tuple[str, str]] = {}
        for kind, dst in requests:
            self._sequence = self._sequence % 0x7FFFFFFF + 1
            pending[self._sequence] = (kind, dst)
            await sock.send(route_message(kind, dst, index, self._sequence))
        while pending:
            for sequence, code in acknowledgements(await sock.recv(65536)):
                request = pending.pop(sequence, None)
                if request is None or code == 0:
                    continue
                kind, dst = request
                if code not in (_IGNORED_ON_ADD if kind == "add" else _IGNORED_ON_DEL):
                    raise DataplaneError(f"netlink: route {kind} {dst}: {os.strerror(code)}")

    async def _open(self) -> trio.socket.SocketType:
        if self._socket is None:
            self._socket = await open_netlink_socket(self.netns)
        return self._socket
