"""One gRPC watch stream of ``GrpcWatchRegistry`` (``grpc_watch``): a call on a worker
thread of its own, moved between watch endpoints.

grpcio has no trio support, so each stream is grpcio's sync API on a worker thread (the
bench's measured ``grpc-trio`` mode): the thread iterates the call, each message already
decoded there (``grpc_codec``), and hands it to trio through a zero-size channel, so the
stream keeps gRPC's flow control. Closing cancels the call first (which ends the thread's
wait on the next message), closes the channel (which ends a wait to hand one on) and lets
the thread's task end: that task runs the thread with ``abandon_on_cancel=False`` inside
the watch's nursery, so the worker never outlives the watch, and none the daemon.

Semantics are the JSON watch's (``watch``): from a start revision, moved to the next
watch endpoint when its stream breaks or ends, resuming after the last event delivered;
a compacted start raises ``WatchCompacted`` (the watcher lists again), a cancel by etcd
or a stream that no endpoint keeps ``RegistryUnavailable``, a cancel for our credentials
the access error that names the flag; a watch resumed past the store's revision (a reset
store) is refused as unavailable. On an etcd member a quiet stream gets the JSON watch's
quiet check (a linearizable read on the member, spaced as ``watch.quiet_wait``); on a
watch endpoint that is not one of the registry's (a grpc-proxy: no JSON gateway, and
progress requests dropped) the channel's keepalive pings are the check (``grpc_watch``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import trio

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.gateway import JSON, watch_request
from vnetd.registry.etcd.grpc_codec import (
    WATCH_METHOD,
    WatchMessage,
    create_request,
    decode_response,
)
from vnetd.registry.etcd.watch import LATE, QuietHints, quiet_wait

log = logging.getLogger("vnetd.registry")


@dataclass(frozen=True)
class Ended:
    """Why a stream ended, and gRPC's status code if it broke."""

    why: str
    code: grpc.StatusCode | None = None


class StreamOpener(Protocol):
    """What a stream needs of its registry (``GrpcWatchRegistry`` provides it)."""

    quiet_hints: QuietHints

    @property
    def watch_endpoint_count(self) -> int: ...

    def watch_attempts(self) -> list[tuple[str, float]]:
        """(endpoint, bound) of each attempt to open a stream, in order."""
        ...

    def watch_failed(self, endpoint: str) -> None: ...

    def watch_answered(self, endpoint: str) -> None: ...

    def is_member(self, endpoint: str) -> bool:
        """Whether ``endpoint`` is one of the registry's etcd members (not a proxy)."""
        ...

    def channel(self, endpoint: str) -> grpc.Channel: ...

    async def watch_metadata(self, endpoint: str) -> tuple[tuple[str, str], ...]: ...

    def token_rejected(self, endpoint: str) -> None: ...

    def refused(self, endpoint: str, ended: Ended, prefix: str) -> RegistryError: ...

    async def member_serves(self, endpoint: str, request: JSON) -> tuple[str | None, int]: ...


class GrpcStream:
    """One watch: a gRPC call on a worker thread, moved between watch endpoints."""

    def __init__(
        self, registry: StreamOpener, prefix: str, start_revision: int, nursery: trio.Nursery
    ) -> None:
        self._registry = registry
        self._prefix = prefix
        self._next_revision = start_revision
        self._nursery = nursery
        self._call: Any = None
        self._requests_done = threading.Event()
        self._pump: trio.CancelScope | None = None
        self._receive: trio.MemoryReceiveChannel[WatchMessage | Ended] | None = None
        self._moves_without_message = 0
        self._progress_since = 0.0
        """When the stream opened or sent its last message, with no event since."""
        self.endpoint = ""

    async def open(self) -> None:
        """Open a confirmed stream from ``_next_revision`` on the first endpoint that
        gives one.

        Raises:
            WatchCompacted: the start revision was compacted.
            RegistryUnavailable: no endpoint confirmed the watch.
        """
        failures: list[str] = []
        for endpoint, bound in self._registry.watch_attempts():
            first: WatchMessage | Ended | None = None
            with trio.move_on_after(bound):
                first = await self._start(endpoint)
            self.endpoint = endpoint
            if isinstance(first, WatchMessage) and first.created:
                self._confirmed(first)
                self._registry.watch_answered(endpoint)
                self._progress_since = trio.current_time()
                return
            if first is None:
                failures.append(f"{endpoint}: no watch confirmation within {bound:g} s")
            else:
                failures.append(f"{endpoint}: {self._why_not(endpoint, first)}")
            await self.aclose()
            self._registry.watch_failed(endpoint)
        raise RegistryUnavailable(
            f"etcd gRPC watch failed on every endpoint: {'; '.join(failures)}"
        )

    async def _start(self, endpoint: str) -> WatchMessage | Ended:
        """Start the call and its thread; the call's first message."""
        metadata = await self._registry.watch_metadata(endpoint)
        stream = self._registry.channel(endpoint).stream_stream(
            WATCH_METHOD,
            request_serializer=_identity,
            response_deserializer=decode_response,
        )
        self._requests_done = threading.Event()
        requests = _requests(create_request(self._prefix, self._next_revision), self._requests_done)
        self._call = stream(requests, metadata=metadata)
        send, self._receive = trio.open_memory_channel[WatchMessage | Ended](0)
        self._pump = await self._nursery.start(_pump, self._call, send)
        return await self._receive.receive()

    def _why_not(self, endpoint: str, first: WatchMessage | Ended) -> str:
        """Why a stream was not confirmed; raises what the caller must see at once."""
        if isinstance(first, WatchMessage):
            self._confirmed(first)  # a compaction or a cancel: raises
            return f"unexpected first message {first!r}"
        if first.code == grpc.StatusCode.UNAUTHENTICATED or "invalid auth token" in first.why:
            self._registry.token_rejected(endpoint)
        if first.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            raise self._registry.refused(endpoint, first, self._prefix)
        return first.why

    def _confirmed(self, message: WatchMessage) -> None:
        """Check a stream's message for a compaction, a cancel or a reset store."""
        if message.compact_revision > 0:
            raise WatchCompacted(message.compact_revision)
        if message.canceled:
            reason = message.cancel_reason or "no reason given"
            if "invalid auth token" in reason:
                self._registry.token_rejected(self.endpoint)
            ended = Ended(f"canceled: {reason}")
            raise self._registry.refused(self.endpoint, ended, self._prefix)
        if message.created and message.revision and self._next_revision > message.revision + 1:
            raise RegistryUnavailable(
                f"etcd watch from revision {self._next_revision}: the store is at revision "
                f"{message.revision} (it was reset); listing again"
            )

    async def aclose(self) -> None:
        """Cancel the call (its thread's wait ends) and its thread's task; the watch's
        nursery waits for the thread."""
        self._requests_done.set()
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        if self._receive is not None:
            self._receive.close()  # a thread still sending gets BrokenResourceError

    def __aiter__(self) -> GrpcStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while True:
            assert self._receive is not None
            item: WatchMessage | Ended | None = None
            wait = self._quiet_wait()
            deadline = trio.current_time() + wait
            with trio.move_on_at(deadline):
                item = await self._receive.receive()
            late = trio.current_time() - deadline
            if item is None and late > LATE:  # as the JSON watch's: see ``watch``
                with trio.move_on_after(min(late, wait)):
                    item = await self._receive.receive()
            if item is None:
                await self._check_quiet()
                continue
            if isinstance(item, Ended):
                await self._move(item)
                continue
            self._confirmed(item)
            self._moves_without_message = 0
            now = trio.current_time()
            if not item.events:  # a progress notification, or a confirmation after a move
                if not item.created:
                    self._registry.quiet_hints.progress_gap = now - self._progress_since
                self._progress_since = now
                continue
            self._progress_since = now
            self._next_revision = max(self._next_revision, item.events[-1].mod_revision + 1)
            return item.events

    def _quiet_wait(self) -> float:
        """The quiet check's wait on an etcd member; none on a proxy (module docstring)."""
        if not self._registry.is_member(self.endpoint):
            return math.inf
        return quiet_wait(self._registry.quiet_hints)

    async def _check_quiet(self) -> None:
        """Move off a quiet stream's member unless it answers a linearizable read."""
        request = watch_request(self._prefix)
        why, keys = await self._registry.member_serves(self.endpoint, request)
        hints = self._registry.quiet_hints
        hints.watchers = keys or hints.watchers
        if why is not None:
            await self._move(Ended(f"the stream was quiet and {why}"))

    async def _move(self, ended: Ended) -> None:
        """Resume on the next endpoint from the revision after the last event delivered."""
        old = self.endpoint
        if ended.code in (grpc.StatusCode.PERMISSION_DENIED,):
            raise self._registry.refused(old, ended, self._prefix)
        if ended.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise RegistryUnavailable(f"etcd gRPC watch on {old}: {ended.why}; listing again")
        self._registry.watch_failed(old)
        self._moves_without_message += 1
        limit = max(2, self._registry.watch_endpoint_count)
        if self._moves_without_message > limit:
            raise RegistryUnavailable(
                f"etcd gRPC watch on {old}: {ended.why}; no endpoint kept the stream"
            )
        await self.aclose()
        await self.open()  # RegistryUnavailable, WatchCompacted: to the consumer
        log.warning(
            "etcd gRPC watch on %s: %s; resumed on %s from revision %d",
            old,
            ended.why,
            self.endpoint,
            self._next_revision,
        )


def _identity(data: bytes) -> bytes:
    return data


def _requests(create: bytes, done: threading.Event) -> Iterator[bytes]:
    """The request side: the create request, then open until the stream closes (etcd
    cancels a watch whose request side ends)."""
    yield create
    done.wait()


async def _pump(
    call: Any,  # noqa: ANN401 - grpcio's call object is untyped
    send: trio.MemorySendChannel[WatchMessage | Ended],
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the call's worker thread until the stream ends or the call is cancelled."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        limiter = trio.CapacityLimiter(1)  # a thread per stream, never queued behind others
        await trio.to_thread.run_sync(_drain, call, send, limiter=limiter)


def _drain(call: Any, send: trio.MemorySendChannel[WatchMessage | Ended]) -> None:  # noqa: ANN401
    """The worker thread: each message to trio, then why the stream ended."""
    try:
        try:
            for message in call:
                trio.from_thread.run(send.send, message)
            ended = Ended("the stream ended")
        except grpc.RpcError as exc:
            ended = Ended(f"the stream broke: {exc.code().name}: {exc.details()}", exc.code())
        trio.from_thread.run(send.send, ended)
    except (trio.Cancelled, trio.RunFinishedError, trio.BrokenResourceError):
        return  # the watch is closing
    finally:
        call.cancel()
