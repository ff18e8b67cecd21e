"""One probe of one peer: UDP echoes with DF set, the small size, the full size, bisection.

The probe service (``vnetd.daemon.probe_service``) runs one ``probe`` per rank it is
asked about. A probe holds one socket and one nonce for its whole life and
listens for the whole of it, so an answer that comes late (a loaded peer, a
handshake that took seconds) still proves its size passed, whichever attempt
it answers. Attempts are spread over the window with jitter (``ATTEMPTS_AT``)
instead of sent in one burst: on a loaded host losses come in bursts (full
socket buffers, a starved event loop), and three echoes sent within 100 ms
were lost together (docs/architecture.md, "Doctor"). Hand-written over trio's
sockets because the protocol is one datagram each way.
"""

from __future__ import annotations

import errno
import math
import os
import random
import socket
import time
from dataclasses import dataclass, field, replace

import trio

from vnetd.doctor.evidence import MAGIC, SMALL

IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IPV6_MTU_DISCOVER = getattr(socket, "IPV6_MTU_DISCOVER", 23)
IPV6_PMTUDISC_DO = getattr(socket, "IPV6_PMTUDISC_DO", 2)

ATTEMPTS_AT = (0.0, 0.25, 0.7, 1.5, 2.6, 3.8)
"""When (s after the probe starts) each attempt of the small and the full echo is sent,
each shifted by up to ``JITTER`` of itself: spread so that one burst of loss does not
take them all, and the last is still answered within ``ECHO_WAIT``."""
JITTER = 0.2
ECHO_WAIT = 4.5
"""How long a probe waits for its small and full echoes (s): far above a mesh's round
trip, room for a late answer from a loaded host or a first handshake, and inside the
row's deadline with room for bisection after it."""
LAST_SEND = ECHO_WAIT - 0.5
"""The latest an attempt is sent, jitter included, so that its answer has time to come."""
REFUSED_BY_A_RULE = (errno.EPERM, errno.EACCES)
"""What a send returns when netfilter drops the packet on its way out (``NF_DROP``)."""
BISECT_AT = (0.0, 0.15)
BISECT_WAIT = 0.4
BISECT_STEPS = 7


def df_socket(family: int) -> trio.socket.SocketType:
    """A UDP socket that never fragments (DF set, no local fragmentation)."""
    sock = trio.socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
    return sock


def header_size(family: int) -> int:
    """IP + UDP header bytes: an inner packet of size S carries S minus this."""
    return 28 if family == socket.AF_INET else 48


@dataclass(frozen=True)
class ProbeResult:
    """What one probe found: round trips (s) of the small and full echoes, the largest
    size that came back (None: not even the small one)."""

    small: float | None = None
    full: float | None = None
    largest: int | None = None
    written: int = 0
    """Bytes of echoes written to the socket (inner IP packets): sends that passed, and
    those a firewall rule in this pod refused (``REFUSED_BY_A_RULE``); not those too big
    for the route or with none."""


@dataclass
class _Echoes:
    """The echoes of one probe on its connected socket: what was sent, what came back."""

    sock: trio.socket.SocketType
    family: int
    nonce: bytes = field(default_factory=lambda: os.urandom(8).hex().encode())
    sent: dict[tuple[int, int], float] = field(default_factory=dict)
    got: dict[int, float] = field(default_factory=dict)
    """Size -> round trip of the first answer of that size (any attempt)."""
    answered: trio.Event = field(default_factory=trio.Event)
    written: int = 0

    async def receive(self) -> None:
        """Record every answer until cancelled (the probe's whole life)."""
        while True:
            try:
                data = await self.sock.recv(65535)
            except OSError:
                continue  # an ICMP error from an earlier send
            parts = data.split(b" ", 4)
            if len(parts) < 4 or parts[0] != MAGIC or parts[1] != self.nonce:
                continue
            if parts[2].isdigit() and parts[3].isdigit():
                size, attempt = int(parts[2]), int(parts[3])
                if (size, attempt) in self.sent and size not in self.got:
                    self.got[size] = time.monotonic() - self.sent[size, attempt]
                    self.answered.set()
                    self.answered = trio.Event()

    async def exchange(self, sizes: list[int], schedule: tuple[float, ...], wait: float) -> None:
        """Send each of ``sizes`` not yet answered at each time of ``schedule`` (jittered),
        until every one is answered or ``wait`` has passed."""
        start = trio.current_time()
        with trio.move_on_after(wait):
            for at in schedule:
                jittered = min(at * (1 + random.uniform(0, JITTER)), LAST_SEND)
                await self._answers(sizes, start + jittered)
                missing = [size for size in sizes if size not in self.got]
                if not missing:
                    return
                for size in missing:
                    await self._send(size)
            await self._answers(sizes, math.inf)

    async def _answers(self, sizes: list[int], until: float) -> None:
        """Until every one of ``sizes`` is answered, or ``until`` (trio time)."""
        with trio.move_on_at(until):
            while not all(size in self.got for size in sizes):
                await self.answered.wait()

    async def _send(self, size: int) -> None:
        attempt = sum(1 for s, _ in self.sent if s == size)
        head = b"%s %s %d %d " % (MAGIC, self.nonce, size, attempt)
        payload = head.ljust(max(len(head), size - header_size(self.family)), b".")
        self.sent[size, attempt] = time.monotonic()
        try:
            await self.sock.send(payload)
        except OSError as exc:
            if exc.errno not in REFUSED_BY_A_RULE:
                return  # too big for the route, no route: never written, counted as lost
            # A firewall rule in this pod dropped it on its way out: counted as written,
            # so the device's count, short of it, names where it went.
        self.written += len(payload) + header_size(self.family)


async def probe(family: int, address: tuple[str, int], mtu: int) -> ProbeResult:
    """Echo to ``address`` at ``SMALL`` and ``mtu`` bytes, bisecting when only the small
    passes; an answer of any attempt counts until the probe ends."""
    sock = df_socket(family)
    with sock:
        try:
            await sock.connect(address)
        except OSError:
            return ProbeResult()  # no route to it (invariant 9): nothing passes
        echoes = _Echoes(sock, family)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echoes.receive)
            result = await _sizes(echoes, mtu)
            nursery.cancel_scope.cancel()
        return replace(result, written=echoes.written)


async def _sizes(echoes: _Echoes, mtu: int) -> ProbeResult:
    got = echoes.got
    await echoes.exchange([SMALL, mtu], ATTEMPTS_AT, ECHO_WAIT)
    if SMALL not in got:
        return ProbeResult()
    low, high = SMALL, mtu  # low passes, high does not
    for _ in range(BISECT_STEPS):
        if mtu in got or high - low <= 8:
            break
        middle = (low + high) // 2
        await echoes.exchange([middle], BISECT_AT, BISECT_WAIT)
        if middle in got:
            low = middle
        else:
            high = middle
    if mtu in got:  # a late answer of the full size: nothing was too big
        return ProbeResult(got[SMALL], got[mtu], mtu)
    return ProbeResult(got[SMALL], None, low)
