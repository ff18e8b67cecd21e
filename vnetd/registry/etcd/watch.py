"""An etcd watch stream that never stays on a member that cannot serve it.

The lines of one watch (the JSON gateway's messages), read by a task of
their own and handed on one at a time, so the stream keeps its TCP back
pressure. The stream moves to another member, resuming from the revision
after the last event it delivered (so nothing is missed or repeated), when:

* its member lost its leader: the watch is opened leader-required
  (``Grpc-Metadata-Hasleader: true``, which the gateway passes on as gRPC
  metadata; etcd 3.4.23 then ends the stream with "etcdserver: no leader"
  within three election timeouts of losing it), or it is shutting down
  ("transport is closing");
* the stream has been quiet for its quiet check (below) and a linearizable
  read on the same member does not answer within the registry's per-endpoint
  bound (a frozen member: it accepts connections and never answers, and a
  leader-required watch on it never ends);
* the stream ends or breaks.

The quiet check costs etcd a request per watch, so it is spaced by what the
stream tells: every watch asks for progress notifications
(``progress_notify``), and a member that sends them (its
``--experimental-watch-progress-notify-interval``, which the operator sets)
shows it is alive with each one: the check then waits 1.5 notification gaps
(at least ``QUIET_CHECK`` s), so a live watch costs no request at rest and a
frozen one is found as soon as its notifications stop. Without them (etcd's
default interval is 10 min) the check comes every ``QUIET_CHECK`` s for a
small mesh and every ``watchers / REST_READS`` s for a large one, jittered,
so a whole mesh costs etcd at most ``REST_READS`` reads a second: the read
counts the keys under the watched prefix, one per member, and each member's
daemon watches it (both the count and the notification gap are kept by the
registry, ``QuietHints``, so a moved or restarted stream starts from them).
A notification carries no event and is not handed on. A check whose timer
fired late (``LATE``: the event loop or the host was busy, as when every
daemon of a lab answers a ``vnetd doctor`` run on two cores) first waits
as long again as it was late, at most one check's wait: a line that came
meanwhile is still queued behind the loop, and a stream is judged quiet only
over time the loop had to read it.
(etcd 3.4.23 answers no ``progress_request`` sent on the stream through the
JSON gateway: the gateway answers a watch only once its request body ends,
so the server's ticker is the only way.)

A move that finds no member raises ``RegistryUnavailable`` (and a resume
from a compacted revision ``WatchCompacted``) to the consumer, which lists
again as it always did. docs/architecture.md, "Watch", has the why.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import trio

from vnetd.errors import RegistryUnavailable
from vnetd.pacing import period, spaced

log = logging.getLogger("vnetd.registry")

JSON = dict[str, Any]

MEMBER_GONE_CODES = frozenset({1, 4, 14})
"""gRPC codes of a stream's error message that move the watch to another member."""
_MOD_REVISION = re.compile(r'"mod_revision"\s*:\s*"(\d+)"')
"""An event's revision in a watch message (int64 fields are strings in the gateway)."""
QUIET_CHECK = 3.0
"""A watch stream quiet this long gets its member checked (one linearizable read),
at the least."""
REST_READS = 20.0
"""The quiet checks per second a whole mesh may cost etcd when its members send no
progress notifications (a watcher's share spaces its checks)."""
PROGRESS_MARGIN = 1.5
"""A member that notifies is checked once its stream is quiet this many gaps."""
LATE = 0.25
"""A quiet check's timer that fires this late (s) waits once more before its read."""


def quiet_check(watchers: int, progress_gap: float | None) -> float:
    """How long a stream may be quiet before its member is checked: ``watchers``
    daemons watch the prefix; ``progress_gap`` is the member's notification
    interval as seen, None before one was seen (unjittered: ``vnetd.pacing``)."""
    wait = spaced(QUIET_CHECK, watchers, REST_READS)
    if progress_gap is None:
        return wait
    return min(wait, max(QUIET_CHECK, PROGRESS_MARGIN * progress_gap))


def quiet_wait(hints: QuietHints) -> float:
    """A stream's next quiet check; when it is spaced for a large mesh, jittered
    (``vnetd.pacing.period``) so the checks of daemons that saw the same last
    event do not come at once (etcd's notifications are spread by its own tickers)."""
    watchers, gap = hints.watchers, hints.progress_gap
    wait = quiet_check(watchers, gap)
    if wait < quiet_check(watchers, None):  # the notifications' wait
        return wait
    return period(QUIET_CHECK, watchers, REST_READS)


@dataclass
class QuietHints:
    """What a watch learnt that spaces its quiet checks, kept by the registry so the
    next stream (a move, the watcher's periodic restart) starts from it."""

    watchers: int = 1
    """Keys under the prefix at the last check: the daemons that watch it."""
    progress_gap: float | None = None
    """The member's progress notification interval, as last seen."""


class WatchOpener(Protocol):
    """What the stream needs from the registry (``EtcdRegistry`` provides it)."""

    quiet_hints: QuietHints

    @property
    def endpoint_count(self) -> int: ...

    async def open_watch_stream(
        self, stack: AsyncExitStack, body: JSON
    ) -> tuple[str, AsyncIterator[str]]:
        """Open a confirmed watch on the first endpoint that gives one: (endpoint, lines)."""
        ...

    async def member_serves(self, endpoint: str, request: JSON) -> tuple[str | None, int]:
        """Whether ``endpoint`` answers a linearizable count of the keys ``request``
        (``key`` and ``range_end``, base64) watches in time: (None, the count; 0 when
        it answered without one), or (why not, 0)."""
        ...

    def endpoint_failed(self, endpoint: str) -> None:
        """Try ``endpoint`` last for a while."""
        ...


@dataclass(frozen=True)
class _Ended:
    why: str


@asynccontextmanager
async def resuming_watch(
    opener: WatchOpener, request: JSON, start_revision: int
) -> AsyncIterator[AsyncIterator[str]]:
    """The lines of the watch ``request`` (a ``create_request`` without its start
    revision) from ``start_revision`` on, moved between members as needed.

    Raises (on entry): what the first open raises.

    Cancellation: the stream and its reader are closed.
    """
    try:
        async with trio.open_nursery() as nursery:
            lines = _ResumingLines(opener, request, start_revision, nursery)
            try:
                await lines.open()
                yield lines
            finally:
                with trio.CancelScope(shield=True):
                    await lines.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the consumer's own error, as itself
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


class _ResumingLines:
    def __init__(
        self, opener: WatchOpener, request: JSON, start_revision: int, nursery: trio.Nursery
    ) -> None:
        self._opener = opener
        self._request = request
        self._next_revision = start_revision
        self._nursery = nursery
        self._stack = AsyncExitStack()
        self._reader: trio.CancelScope | None = None
        self._receive: trio.MemoryReceiveChannel[str | _Ended] | None = None
        self._moves_without_message = 0
        self._hints = opener.quiet_hints
        self._progress_since = 0.0
        """When the stream opened or sent its last notification, with no event since."""
        self.endpoint = ""

    async def open(self) -> None:
        """Open the stream from ``_next_revision`` and start its reader."""
        create = {**self._request, "progress_notify": True}
        body = {"create_request": {**create, "start_revision": str(self._next_revision)}}
        stack = AsyncExitStack()
        try:
            endpoint, lines = await self._opener.open_watch_stream(stack, body)
        except BaseException:
            await stack.aclose()
            raise
        send, receive = trio.open_memory_channel[str | _Ended](0)
        self._stack, self._receive, self.endpoint = stack, receive, endpoint
        self._reader = await self._nursery.start(_read, lines, send)
        self._progress_since = trio.current_time()

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        await self._stack.aclose()

    def __aiter__(self) -> _ResumingLines:
        return self

    async def __anext__(self) -> str:
        while True:
            assert self._receive is not None
            item: str | _Ended | None = None
            wait = self._quiet_for()
            deadline = trio.current_time() + wait
            with trio.move_on_at(deadline):
                item = await self._receive.receive()
            late = trio.current_time() - deadline
            if item is None and late > LATE:
                with trio.move_on_after(min(late, wait)):
                    item = await self._receive.receive()
            if item is None:
                why, keys = await self._opener.member_serves(self.endpoint, self._request)
                self._hints.watchers = keys or self._hints.watchers
                if why is not None:
                    await self._move(f"the stream was quiet and {why}")
                continue
            if isinstance(item, _Ended):
                await self._move(item.why)
                continue
            why = _member_gone(item)
            if why is not None:
                await self._move(why)
                continue
            self._moves_without_message = 0
            now = trio.current_time()
            if _is_progress(item):
                self._hints.progress_gap = now - self._progress_since
                self._progress_since = now
                continue
            self._progress_since = now
            self._note_revision(item)
            return item

    def _quiet_for(self) -> float:
        return quiet_wait(self._hints)

    async def _move(self, why: str) -> None:
        """Resume on another member from the revision after the last event delivered."""
        old = self.endpoint
        self._opener.endpoint_failed(old)
        self._moves_without_message += 1
        if self._moves_without_message > max(2, self._opener.endpoint_count):
            raise RegistryUnavailable(f"etcd watch on {old}: {why}; no member kept the stream")
        await self.aclose()
        await self.open()  # RegistryUnavailable, WatchCompacted: to the consumer
        log.warning(
            "etcd watch on %s: %s; resumed on %s from revision %d",
            old,
            why,
            self.endpoint,
            self._next_revision,
        )

    def _note_revision(self, line: str) -> None:
        """Resume after the last event of ``line``. Found by a scan, not a decode: the
        consumer decodes every message already, and a batch of a storm is 1000 events
        (keys and values are base64, so no value can hold the pattern)."""
        revisions = _MOD_REVISION.findall(line)
        if revisions:
            self._next_revision = max(self._next_revision, max(map(int, revisions)) + 1)


async def _read(
    lines: AsyncIterator[str],
    send: trio.MemorySendChannel[str | _Ended],
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.CancelScope() as scope:
        task_status.started(scope)
        try:
            async for line in lines:
                if line.strip():
                    await send.send(line)
            await send.send(_Ended("the stream ended"))
        except (httpx.TransportError, httpx.StreamError) as exc:
            await send.send(_Ended(f"the stream broke: {exc!r}"))


def _is_progress(line: str) -> bool:
    """A progress notification: a message with a header and nothing else (found by
    a scan: there is one per quiet watch per interval, and none is worth a decode)."""
    return not any(
        field in line for field in ('"events"', '"created"', '"canceled"', '"compact_revision"')
    )


def _member_gone(line: str) -> str | None:
    """Why the stream ended, for the error messages that say its member cannot serve it
    (it lost its leader, or it is shutting down: gRPC codes CANCELLED, DEADLINE_EXCEEDED,
    UNAVAILABLE); None for any other line."""
    if '"error"' not in line:
        return None
    try:
        error = json.loads(line).get("error")
    except ValueError:
        return None
    if not isinstance(error, dict) or error.get("grpc_code") not in MEMBER_GONE_CODES:
        return None
    return f"the stream ended with {error.get('message', 'no message')!r}"
