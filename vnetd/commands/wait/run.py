"""The wait loop: follow the members (list, then watch), poll the device, report.

The members come from ``sync_members``, the daemon's own list-then-watch
loop, so etcd is never polled; while it is unreachable the last list is
kept and the wait goes on until the deadline. With ``--reachable`` the
local WireGuard device's peers are read every ``poll_interval`` seconds through a
``PeerReader`` (in production ``uapi_peers`` of ``vnetd.commands.wait.command``,
through ``dataplane.device_reader``'s ``read_local_device``: the UAPI socket, or
the kernel device by netlink; a fake in tests). A rank counts as reached by the
handshake of the peer that holds its address (``wait.gate.carriers``): its own,
or its site gateway's.
Every time is trio's clock, so tests with ``autojump_clock`` are exact.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import trio

from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.errors import DataplaneError
from vnetd.model import DevicePeer
from vnetd.registry.base import Registry
from vnetd.spec import MeshSpec
from vnetd.wait.gate import Gate, Status, carriers, evaluate, handshake_keys, progress_line

PeerReader = Callable[[], Awaitable[Mapping[str, DevicePeer]]]
"""Returns the local device's peers by public key, with their allowed IPs and last
handshake; raises ``DataplaneError`` when the device cannot be read."""

REPORT_INTERVAL = 5.0
POLL_INTERVAL = 0.5
FIRST_LIST_GRACE = 1.0
"""The first progress line waits this long at most for the first member list."""


@dataclass(frozen=True)
class Outcome:
    ready: bool
    elapsed: float
    summary: str
    notes: tuple[str, ...]
    """What stands in the way besides the members: registry or device trouble."""


class _Device:
    """The peers last read from the local device, or why it could not be read."""

    def __init__(self, read: PeerReader) -> None:
        self._read = read
        self.peers: Mapping[str, DevicePeer] = {}
        self.problem: str | None = "device not read yet"

    async def refresh(self) -> None:
        try:
            self.peers = dict(await self._read())
        except DataplaneError as exc:
            self.peers = {}
            self.problem = f"device not readable: {exc}"
        else:
            self.problem = None


class _Waiter:
    def __init__(
        self,
        gate: Gate,
        spec: MeshSpec,
        timeout: float,
        view: MemberView,
        health: RegistryHealth,
        device: _Device | None,
    ) -> None:
        self.gate = gate
        self.spec = spec
        self.timeout = timeout
        self.view = view
        self.health = health
        self.device = device

    def status(self) -> Status:
        # A member held after a registry reset has not registered again yet.
        registered = {
            rank: member.public_key
            for rank, member in self.view.members.items()
            if rank not in self.view.held
        }
        peers = self.device.peers if self.device is not None else {}
        return evaluate(
            self.gate,
            carriers(self.spec, registered, peers),
            handshake_keys(peers),
            listed=self.view.synced,
        )

    def notes(self) -> tuple[str, ...]:
        notes: list[str] = []
        if self.health.reachable is False:
            kept = " (members as last listed)" if self.view.synced else ""
            notes.append(f"registry unreachable{kept}")
        elif not self.view.synced:
            notes.append("registry not read yet")
        if self.device is not None and self.device.problem is not None:
            notes.append(self.device.problem)
        return tuple(notes)

    async def until_ready(
        self,
        start: float,
        report: Callable[[str], None],
        report_interval: float,
        poll_interval: float,
    ) -> None:
        """Return once the gate is open; report progress on the way."""
        next_report = start + min(FIRST_LIST_GRACE, report_interval)
        next_poll = start
        reported = False
        while True:
            if self.device is not None and trio.current_time() >= next_poll:
                await self.device.refresh()
                next_poll = trio.current_time() + poll_interval
            version = self.view.version
            status = self.status()
            if status.ready:
                return
            now = trio.current_time()
            settled = self.view.synced or self.health.reachable is False
            if now >= next_report or (not reported and settled):
                report(progress_line(status.summary, self.notes(), now - start, self.timeout))
                reported = True
                next_report = now + report_interval
            wake = min(next_report, next_poll) if self.device is not None else next_report
            with trio.move_on_at(wake):
                await self.view.wait_changed(version)


async def wait_for_gate(
    gate: Gate,
    spec: MeshSpec,
    registry: Registry,
    *,
    timeout: float,  # noqa: ASYNC109 (the deadline comes from the command line)
    report: Callable[[str], None],
    read_peers: PeerReader | None = None,
    report_interval: float = REPORT_INTERVAL,
    poll_interval: float = POLL_INTERVAL,
) -> Outcome:
    """Wait until ``gate`` is open or ``timeout`` seconds have passed.

    Args:
        report: called with a progress line at the start (once the members
            are listed, or after ``FIRST_LIST_GRACE``) and every
            ``report_interval`` seconds until the gate opens.
        read_peers: the device's peers; required when ``gate.reachable``.

    Returns:
        Whether the gate opened, when, and the last summary.

    Raises:
        RegistryError: the registry refused a request (not: was unreachable).

    Cancellation: safe; the member watch is closed.
    """
    if gate.reachable and read_peers is None:
        raise ValueError("a reachable gate needs a device reader")
    start = trio.current_time()
    view = MemberView()
    health = RegistryHealth()
    device = _Device(read_peers) if gate.reachable and read_peers else None
    waiter = _Waiter(gate, spec, timeout, view, health, device)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, spec, view, health)
        with trio.move_on_at(start + timeout):
            await waiter.until_ready(start, report, report_interval, poll_interval)
        nursery.cancel_scope.cancel()
    status = waiter.status()
    return Outcome(status.ready, trio.current_time() - start, status.summary, waiter.notes())
