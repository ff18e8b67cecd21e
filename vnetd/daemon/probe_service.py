"""Each daemon's probe service: a UDP echo and a TCP row request, on its overlay address.

The doctor (``vnetd doctor``) asks every daemon for its row: the daemon
probes each rank asked about (``vnetd.daemon.probe_echo``: 64 bytes and its device
MTU with DF set, bisecting when only the small one passes), watches how late
its own event loop runs meanwhile, and reports what its device says of each.
Bound to the overlay address only, answering only addresses of the mesh's
networks; one request runs at a time, each bounded by its own deadline and
``MAX_DEADLINE``. Hand-written over trio's sockets because the protocol is
two messages; see docs/architecture.md, "Doctor".
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping

import trio

from vnetd.daemon.probe_echo import ECHO_WAIT, ProbeResult, df_socket, probe
from vnetd.dataplane.base import Dataplane
from vnetd.doctor.evidence import (
    LAG_LIMIT,
    MAGIC,
    MAX_REQUEST,
    MAX_ROW,
    PeerSeen,
    Row,
    RowRequest,
    WireError,
    decode_request,
    decode_row,
    encode_request,
    encode_row,
)
from vnetd.errors import VnetdError
from vnetd.model import DevicePeer, Member
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.doctor")

MAX_DEADLINE = 30.0
REPLY_MARGIN = 1.0
"""Kept back from a request's deadline for reading the device and sending the row (s)."""
REQUEST_WAIT = 5.0
"""How long a connection may take to send its request (s)."""
MAX_PARALLEL = 64
"""Peers probed at once (each holds one UDP socket): a healthy peer's probe takes one
round trip, so this paces a row without lengthening it."""
START_GAP = 0.0005
"""Between the starts of two probes of a row (s): a row of 1000 peers starts over 0.5 s
instead of sending 2000 datagrams at once."""
TICK = 0.1
"""How often the row's lag watch wakes (s) to measure how late the event loop runs."""


class ProbeService:
    """The probe service of one daemon (``serve`` runs it)."""

    def __init__(
        self,
        spec: MeshSpec,
        me: Member,
        mtu: int,
        dataplane: Dataplane,
        on_black_hole: Callable[[int, int], None] | None = None,
    ) -> None:
        self.spec = spec
        self.me = me
        self.mtu = mtu
        self.dataplane = dataplane
        self.on_black_hole = on_black_hole
        self.lowered: dict[int, int] = {}
        """Peers whose route MTU this service locked, and to what."""
        self.address = str(spec.address(me.rank))
        self.family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        self._one_at_a_time = trio.Lock()
        self.heard: Counter[str] = Counter()
        """Echo datagrams received, by source address (since the service started)."""

    def in_mesh(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            return False
        return any(ip in network for network in self.spec.networks)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer echoes and row requests until cancelled; nothing a request does ends it.

        Raises:
            VnetdError: the port cannot be bound on the overlay address.
        """
        port = self.spec.doctor_port
        echo = df_socket(self.family)
        with echo:
            try:
                await echo.bind((self.address, port))
                listeners = await trio.open_tcp_listeners(port, host=self.address)
            except OSError as exc:
                raise VnetdError(
                    f"mesh.doctor_port {port}: cannot serve it on {self.address}: "
                    f"{exc.strerror or exc} (pick a free port, or 0 to turn the probe "
                    "service off)"
                ) from None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._echo, echo)
                await nursery.start(trio.serve_listeners, self._answer, listeners)
                log.info("probe service at %s port %d (tcp, udp)", self.address, port)
                task_status.started()

    async def _echo(self, sock: trio.socket.SocketType) -> None:
        while True:
            try:
                data, source = await sock.recvfrom(65535)
            except OSError:
                continue  # an ICMP error queued on the socket
            if data.startswith(MAGIC) and self.in_mesh(source[0]):
                self.heard[source[0]] += 1
                try:
                    await sock.sendto(data, source)
                except OSError:
                    pass  # too big for the path back, or no route: the asker sees a loss

    async def _answer(self, stream: trio.SocketStream) -> None:
        try:
            await self._answer_one(stream)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info("doctor request: connection lost: %s", exc)
        except Exception:  # a bug here must not end the daemon
            log.exception("doctor request failed")

    async def _answer_one(self, stream: trio.SocketStream) -> None:
        async with stream:
            peer = stream.socket.getpeername()
            if not self.in_mesh(peer[0]):
                return
            try:
                with trio.fail_after(REQUEST_WAIT):
                    line = await _read_line(stream, MAX_REQUEST)
                request = decode_request(line, self.spec.size)
            except (trio.TooSlowError, WireError, trio.BrokenResourceError) as exc:
                log.info("doctor request from %s refused: %s", peer[0], exc)
                return
            # The request's deadline runs from its arrival: one queued behind another
            # run's probes waits no longer than its client does (invariant 8).
            until = trio.current_time() + min(request.deadline, MAX_DEADLINE) - REPLY_MARGIN
            with trio.move_on_at(until) as queued:
                await self._one_at_a_time.acquire()
            if queued.cancelled_caught:
                log.info("doctor request from %s dropped: its deadline passed queued", peer[0])
                return
            try:
                row = await self.row(
                    [r for r in request.ranks if r != self.me.rank],
                    max(until - trio.current_time(), ECHO_WAIT),
                )
            finally:
                self._one_at_a_time.release()
            try:
                await stream.send_all(encode_row(row) + b"\n")
            except trio.BrokenResourceError:
                return

    async def row(self, ranks: list[int], deadline: float) -> Row:
        """This daemon's row for ``ranks``: echoes first, then the device, within ``deadline``.

        Each peer's ``lag`` is how late this event loop ran at worst while probing: a
        loss seen with a lag above ``LAG_LIMIT`` is not evidence of a network fault."""
        before = await self.dataplane.peers()
        heard = self.heard.copy()
        results: dict[int, ProbeResult] = {}
        limit = trio.Semaphore(MAX_PARALLEL)
        lag = _Lag()
        with trio.move_on_after(deadline):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lag.watch)
                async with trio.open_nursery() as probes:
                    for rank in ranks:
                        await limit.acquire()
                        probes.start_soon(self._probe_into, rank, results, limit)
                        await trio.sleep(START_GAP)
                nursery.cancel_scope.cancel()
        after = await self.dataplane.peers()
        heard = self.heard - heard
        now = time.time()
        holder = _holders(after)
        peers: dict[int, PeerSeen] = {}
        for rank in ranks:
            key = next((holder[r] for r in self.spec.allowed_ips(rank) if r in holder), None)
            device = after.get(key) if key is not None else None
            old = before.get(key) if key is not None else None
            found = results.get(rank, ProbeResult())
            peers[rank] = PeerSeen(
                rank=rank,
                key=key,
                endpoint=device.endpoint if device else None,
                handshake_age=_age(device, now),
                rx_bytes=device.rx_bytes if device else 0,
                tx_bytes=device.tx_bytes if device else 0,
                small_rtt=found.small,
                full_rtt=found.full,
                largest=found.largest,
                delivered=(device.rx_bytes - old.rx_bytes) if device and old else 0,
                lag=round(lag.worst, 3),
                echoed=heard[str(self.spec.address(rank))],
                written=found.written,
                sent=(device.tx_bytes - (old.tx_bytes if old else 0)) if device else 0,
            )
        if lag.worst > LAG_LIMIT:
            log.warning(
                "doctor probes ran on an overloaded daemon (event loop %.1f s late): "
                "their losses are reported as such, and no route MTU is changed",
                lag.worst,
            )
        else:
            for seen in peers.values():
                if seen.small_rtt is not None and seen.full_rtt is None and seen.largest:
                    await self._lower(seen.rank, seen.largest)
        return Row(self.me.rank, self.me.instance, self.me.public_key, self.mtu, peers)

    async def rows_about(
        self, ranks: list[int], helpers: list[int], deadline: float
    ) -> dict[int, Row]:
        """This daemon's row for ``ranks`` and the rows of ``helpers`` (ranks it reaches)
        about them, asked over the overlay at once, within ``deadline``: the mesh gate's
        evidence, as ``vnetd doctor`` gathers it for those ranks."""
        rows: dict[int, Row] = {}

        async def own() -> None:
            rows[self.me.rank] = await self.row(ranks, deadline)

        async def helper(rank: int) -> None:
            row = await ask_row(self.spec, rank, tuple(ranks), deadline)
            if row is not None and row.rank == rank:
                rows[rank] = row

        with trio.move_on_after(deadline + 2.0):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(own)
                for rank in helpers:
                    nursery.start_soon(helper, rank)
        return rows

    async def _lower(self, rank: int, largest: int) -> None:
        """Lock the route MTU of ``rank``'s addresses to what passed (a black hole).

        Probed again, sizes above the lock fail at the sender, so the largest that
        passes stays at or below it: the lock only ever goes down, and is set again
        each time (the peer's route may have been re-added without it)."""
        from vnetd.dataplane.rtnetlink.route_mtu import lock_route_mtu

        mtu = min(largest, self.lowered.get(rank, largest))
        try:
            for route in self.spec.allowed_ips(rank)[:1]:  # the primary network's host route
                await lock_route_mtu(self.spec.interface, route, mtu)
        except (VnetdError, OSError, ValueError) as exc:
            log.warning("path MTU black hole to rank %d: cannot lower its route MTU: %s", rank, exc)
            return
        if self.lowered.get(rank) != mtu:
            log.warning(
                "path MTU black hole to rank %d: %d-byte packets pass, %d-byte ones do not; "
                "its route MTU is locked to %d",
                rank, mtu, self.mtu, mtu,
            )  # fmt: skip
        self.lowered[rank] = mtu
        if self.on_black_hole is not None:
            self.on_black_hole(rank, mtu)

    async def _probe_into(
        self, rank: int, results: dict[int, ProbeResult], limit: trio.Semaphore
    ) -> None:
        try:
            address = (str(self.spec.address(rank)), self.spec.doctor_port)
            results[rank] = await probe(self.family, address, self.mtu)
        finally:
            limit.release()


async def ask_row(spec: MeshSpec, rank: int, ranks: tuple[int, ...], budget: float) -> Row | None:
    """``rank``'s row from its probe service over the overlay, or None (no answer within
    ``budget`` + 2 s: the service keeps its probes 1 s inside ``budget``). The client of
    ``vnetd doctor`` and of the mesh gate's verdict."""
    request = RowRequest(tuple(r for r in ranks if r != rank), budget)
    with trio.move_on_after(budget + 2.0):
        try:
            stream = await trio.open_tcp_stream(str(spec.address(rank)), spec.doctor_port)
            async with stream:
                await stream.send_all(encode_request(request) + b"\n")
                buffer = bytearray()
                while len(buffer) <= MAX_ROW:
                    chunk = await stream.receive_some(1 << 16)
                    if not chunk:
                        break
                    buffer += chunk
                    if buffer.endswith(b"\n"):
                        break
            return decode_row(bytes(buffer))
        except (OSError, trio.BrokenResourceError, WireError):
            return None
    return None


class _Lag:
    """The worst lateness of this event loop (s) while ``watch`` runs."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self) -> None:
        while True:
            asleep = trio.current_time()
            await trio.sleep(TICK)
            self.worst = max(self.worst, trio.current_time() - asleep - TICK)


async def _read_line(stream: trio.SocketStream, limit: int) -> bytes:
    buffer = bytearray()
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        if len(buffer) > limit:
            raise WireError("request too long")
    return bytes(buffer.split(b"\n", 1)[0])


def _holders(peers: Mapping[str, DevicePeer]) -> dict[str, str]:
    return {route: key for key, peer in peers.items() for route in peer.allowed_ips}


def _age(device: DevicePeer | None, now: float) -> float | None:
    if device is None or device.last_handshake <= 0:
        return None
    return max(0.0, now - device.last_handshake)
