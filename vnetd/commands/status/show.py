"""What ``vnetd status`` shows: one look at the registry and the device, drawn once or live.

One list of the members per view (each bounded by ``READ_TIMEOUT``), and while
ranks are missing a write probe at most every ``FULL_CHECK_EVERY`` s (a full
registry, etcd's NOSPACE, is then a note: they could not claim); where
this host sees the mesh's WireGuard device (inside a pod, beside ``vnetd
up``) also its handshakes and counters. With ``--watch`` a registry outage
is a note in the view, not an exit. The command's parser and options are
``vnetd.commands.status.command``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from vnetd.commands.status.plan import StatusPlan
from vnetd.control.membership import read_members
from vnetd.control.write_probe import writes_refused
from vnetd.errors import DataplaneError, RegistryError, RegistryUnavailable
from vnetd.model import DevicePeer, Member
from vnetd.registry import Registry, RegistryOpener
from vnetd.spec import MeshSpec
from vnetd.status.table import plain_console, print_plain, status_renderable
from vnetd.status.view import as_json, rank_rows, registry_full_note, utc_text

if TYPE_CHECKING:  # the reader imports pyroute2: only when a device is read
    from vnetd.dataplane.device_reader import LocalDevice

READ_TIMEOUT = 10.0
"""One read of the members, seconds (every endpoint tried within it)."""
DEVICE_TIMEOUT = 2.0
"""One request to the local device (a UAPI ``get`` or a netlink dump), seconds."""
FULL_CHECK_EVERY = 30.0
"""With ``--watch``, how often a mesh with missing ranks is asked whether the registry
takes writes (``control.write_probe``: one lease grant, revoked), seconds."""

DeviceReader = Callable[[Path], Awaitable["LocalDevice"]]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Snapshot:
    """What one look at the registry and the device found."""

    now: float
    members: Mapping[int, Member]
    bad_entries: int
    device: LocalDevice | None
    notes: tuple[str, ...]

    @property
    def peers(self) -> dict[str, DevicePeer] | None:
        return self.device.peers if self.device is not None else None

    @property
    def local_key(self) -> str | None:
        return self.device.public_key if self.device is not None else None

    def document(self, spec: MeshSpec) -> dict[str, Any]:
        return as_json(
            spec,
            self.members,
            self.peers,
            self.now,
            local_key=self.local_key,
            bad_entries=self.bad_entries,
            notes=self.notes,
        )

    def renderable(
        self, spec: MeshSpec, *, plain: bool, summary_first: bool = False
    ) -> RenderableType:
        rows = rank_rows(spec, self.members, self.peers, self.now, local_key=self.local_key)
        return status_renderable(
            spec, rows, self.now, notes=self.notes, plain=plain, summary_first=summary_first
        )


class Observer:
    """Takes snapshots; remembers the last member list for ``--watch``."""

    def __init__(
        self,
        plan: StatusPlan,
        registry: Registry,
        read_device: DeviceReader,
        clock: Clock,
    ) -> None:
        self.plan = plan
        self.registry = registry
        self.read_device = read_device
        self.clock = clock
        self.last: tuple[dict[int, Member], int, float] | None = None
        """The last members read, the bad entries among them, and when."""
        self.full: str | None = None
        """etcd's refusal of our write probe for space, as last asked."""
        self.full_checked_at: float | None = None

    async def snapshot(self) -> Snapshot | str:
        """A snapshot; with ``--watch``, the reason instead when there has never been one.

        Raises:
            RegistryUnavailable: the members could not be read (not with
                ``--watch``: then the last list is kept and a note says so).
        """
        notes: list[str] = []
        try:
            members, bad = await self._read_members()
            self.last = (members, bad, self.clock())
            full = await self._writes_refused(members)
            if full is not None:
                notes.append(registry_full_note(full))
        except RegistryError as exc:
            if not self.plan.watch:
                raise
            if self.last is None:
                return f"vnetd status: {exc}; retrying every {self.plan.interval:g} s"
            members, bad, read_at = self.last
            notes.append(f"registry unreachable; members as read at {utc_text(read_at)}: {exc}")
        if bad:
            notes.append(
                f"skipped {bad} registry entries of mesh {self.plan.spec.name} that are not members"
            )
        device, problem = await self._read_device()
        if problem is not None:
            notes.append(f"no device columns: {problem}")
        return Snapshot(self.clock(), members, bad, device, tuple(notes))

    async def _writes_refused(self, members: Mapping[int, Member]) -> str | None:
        """etcd's refusal of writes for space while ranks are missing (they could not
        claim), else None; asked (one lease grant, revoked) at most every
        ``FULL_CHECK_EVERY`` s with ``--watch``."""
        spec = self.plan.spec
        if len(members) >= spec.size:
            self.full = None
            return None
        now = self.clock()
        if self.full_checked_at is None or now - self.full_checked_at >= FULL_CHECK_EVERY:
            self.full_checked_at = now
            self.full = await writes_refused(self.registry, spec.registry.lease_ttl)
        return self.full

    async def _read_members(self) -> tuple[dict[int, Member], int]:
        spec = self.plan.spec
        fix = f"check that etcd runs at {', '.join(spec.registry.endpoints)}, or pass --etcd URL"
        try:
            with trio.fail_after(READ_TIMEOUT):
                return await read_members(self.registry, spec)
        except trio.TooSlowError:
            raise RegistryUnavailable(
                f"reading the members of mesh {spec.name}: no answer within "
                f"{READ_TIMEOUT:g} s; {fix}"
            ) from None
        except RegistryUnavailable as exc:
            raise RegistryUnavailable(
                f"reading the members of mesh {spec.name}: {exc}; {fix}"
            ) from None

    async def _read_device(self) -> tuple[LocalDevice | None, str | None]:
        """The device, or why there is none (never an error)."""
        # No deadline over the whole read: the reader bounds each request to the
        # device, and the first read of a kernel device imports pyroute2 before its
        # request (seconds on a slow node, 3 s in the TCG guest), which is no answer late.
        try:
            return await self.read_device(self.plan.device_socket), None
        except DataplaneError as exc:
            return None, str(exc)


async def show_status(
    plan: StatusPlan,
    *,
    open_registry: RegistryOpener | None = None,
    read_device: DeviceReader | None = None,
    console: Console | None = None,
    clock: Clock = time.time,
    iterations: int | None = None,
) -> int:
    """Show the status once, or with ``plan.watch`` every ``plan.interval`` s.

    Args:
        open_registry: opens the registry on the spec's endpoints (default etcd).
        read_device: reads the local device at a socket path (default
            wireguard-go's UAPI).
        console: where to draw (default stdout: live on a terminal, plain text
            otherwise).
        clock: the wall clock, for "since" and handshake ages.
        iterations: with ``plan.watch``, stop after this many views (tests).

    Returns:
        The exit status, 0.

    Raises:
        RegistryUnavailable: (without ``--watch``) the members could not be read.

    Cancellation: safe; the registry client is closed.
    """
    if open_registry is None:
        from vnetd.registry import open_registry as open_settings_registry

        open_registry = open_settings_registry
    if read_device is None:
        read_device = partial(_read_uapi_device, max_peers=plan.spec.size - 1)
    console = console or _stdout_console()
    async with open_registry(plan.spec.registry) as registry:
        observer = Observer(plan, registry, read_device, clock)
        if not plan.watch:
            _show(plan, console, await observer.snapshot(), first=True)
            return 0
        with _LiveView(console, enabled=console.is_terminal and not plan.json) as live:
            shown = 0
            while iterations is None or shown < iterations:
                if shown:
                    await trio.sleep(plan.interval)
                snapshot = await observer.snapshot()
                if live.enabled:
                    live.update(_live_renderable(plan, snapshot))
                else:
                    _show(plan, console, snapshot, first=not shown)
                shown += 1
    return 0


def _show(plan: StatusPlan, console: Console, snapshot: Snapshot | str, *, first: bool) -> None:
    """One view as plain text or JSON (a JSON line per view with ``--watch``)."""
    if isinstance(snapshot, str):
        print(snapshot, file=sys.stderr, flush=True)
        return
    if plan.json:
        document = snapshot.document(plan.spec)
        text = json.dumps(document, indent=None if plan.watch else 2)
        console.file.write(text + "\n")
        console.file.flush()
        return
    if not first:
        console.file.write("\n")
    if console.is_terminal:
        console.print(snapshot.renderable(plan.spec, plain=False))
    else:
        print_plain(console, snapshot.renderable(plan.spec, plain=True))


def _live_renderable(plan: StatusPlan, snapshot: Snapshot | str) -> RenderableType:
    if isinstance(snapshot, str):
        return Text(snapshot, style="yellow")
    return snapshot.renderable(plan.spec, plain=False, summary_first=True)


class _LiveView:
    """``rich.live.Live`` on a terminal; nothing otherwise (views are printed one by one)."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self.enabled = enabled
        self._live = Live(console=console, auto_refresh=False) if enabled else None

    def __enter__(self) -> _LiveView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def update(self, renderable: RenderableType) -> None:
        assert self._live is not None
        self._live.update(renderable, refresh=True)


def _stdout_console() -> Console:
    if sys.stdout.isatty():
        return Console(highlight=False)
    return plain_console(sys.stdout)


async def _read_uapi_device(path: Path, max_peers: int = 0) -> LocalDevice:
    from vnetd.dataplane.device_reader import read_local_device

    return await read_local_device(path, DEVICE_TIMEOUT, max_peers)
