"""The peers' host routes, changed over one long-lived trio netlink socket.

A join's pass adds one /32 (/128) route (invariant 9). Through pyroute2's sync
``IPRoute`` that was a worker thread and a new ``IPRoute`` per change (an
asyncio loop, a socketpair and an epoll each): about 2 ms of CPU and two
thread wake-ups, which on loaded cores cost a pass tens of ms of wall time.
Here each change is one netlink request (an add with the fields pyroute2's
``route("add", dst=, oif=)`` sends, a delete with those of ``ip route del``;
a unit test compares the bytes with pyroute2's ``rtmsg``), written to a
non-blocking ``NETLINK_ROUTE`` socket of the daemon's own network namespace
on the event loop, and the kernel's acknowledgements are read back; see
docs/architecture.md, "Data plane and routing".
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable

import trio

from vnetd.dataplane.netlink_wire import (
    ERRNO,
    RT_TABLE_MAIN,
    RTA_DST,
    RTA_OIF,
    RTA_TABLE,
    RTMSG,
    RTPROT_STATIC,
    U32,
    attribute,
    message,
    messages,
)
from vnetd.dataplane.pyroute2_package import defer_package_init
from vnetd.errors import DataplaneError

defer_package_init()

from pyroute2.netlink import (  # noqa: E402 (after the deferral)
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_ERROR,
)
from pyroute2.netlink.rtnl import RTM_DELROUTE, RTM_NEWROUTE  # noqa: E402

ROUTE_TIMEOUT = 5.0  # one batch of route changes (invariant 8), plus REQUEST_ALLOWANCE each
REQUEST_ALLOWANCE = 0.01
"""Seconds more of a batch's bound per route: 1000 took 5.3 s in the TCG guest at a load
of 90 on 2 cores (a fixed 5 s bound failed them), about 50 ms on a node."""
WINDOW = 64  # requests in flight before their acknowledgements are read
_RT_SCOPE_UNIVERSE = 0
_RT_SCOPE_NOWHERE = 255  # on a delete: any scope (as ``ip route del``)
_RTN_UNICAST = 1
_ADD_FLAGS = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_IGNORED_ON_ADD = (errno.EEXIST,)
_IGNORED_ON_DEL = (errno.ESRCH, errno.ENOENT)


def route_message(kind: str, dst: str, oif: int, sequence: int) -> bytes:
    """The netlink request that adds (``kind`` "add") or deletes ("del") the route
    to ``dst`` (a CIDR) via the link ``oif`` in the main table.

    The bytes of pyroute2's ``rtmsg`` with these fields (a unit test compares
    them), packed directly: ``rtmsg.encode`` costs about
    0.3 ms of CPU per message on a pass's cold caches, this about 20 µs.
    """
    address, _, prefix = dst.partition("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    packed = socket.inet_pton(family, address)
    prefixlen = int(prefix) if prefix else 8 * len(packed)
    if kind == "add":
        kind_flags = (RTM_NEWROUTE, _ADD_FLAGS)
        proto, scope, rtype = RTPROT_STATIC, _RT_SCOPE_UNIVERSE, _RTN_UNICAST
    else:
        kind_flags = (RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK)
        proto, scope, rtype = 0, _RT_SCOPE_NOWHERE, 0
    body = RTMSG.pack(family, prefixlen, 0, 0, RT_TABLE_MAIN, proto, scope, rtype, 0)
    body += attribute(RTA_TABLE, U32.pack(RT_TABLE_MAIN))
    body += attribute(RTA_DST, packed)
    body += attribute(RTA_OIF, U32.pack(oif))
    return message(*kind_flags, sequence, body)


def acknowledgements(data: bytes) -> Iterable[tuple[int, int]]:
    """``(sequence, errno)`` of each NLMSG_ERROR message in ``data`` (errno 0: done)."""
    for kind, _, sequence, payload in messages(data):
        if kind == NLMSG_ERROR:
            yield sequence, -ERRNO.unpack_from(payload)[0]


class RouteSocket:
    """One ``NETLINK_ROUTE`` socket in the daemon's namespace, opened at first use."""

    def __init__(self, timeout: float = ROUTE_TIMEOUT) -> None:
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
        sock = self._open()
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

    def _open(self) -> trio.socket.SocketType:
        if self._socket is None:
            self._socket = trio.socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE
            )
        return self._socket
