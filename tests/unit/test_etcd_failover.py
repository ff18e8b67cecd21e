"""EtcdRegistry across several members: per-endpoint bounds, failover, watch moves.

Scripted gateways on virtual time: a frozen member is one whose handler never
returns, as a SIGSTOPped etcd accepts the connection and never answers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from vnetd.errors import RegistryUnavailable
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.endpoints import ATTEMPT_TIMEOUT, FAILED_ENDPOINT_LAST_FOR
from vnetd.registry.etcd.gateway import watch_events as _watch_events
from vnetd.registry.etcd.watch import (
    QUIET_CHECK,
    REST_READS,
    QuietHints,
    quiet_check,
    resuming_watch,
)

A, B, C = "http://a:2379", "http://b:2379", "http://c:2379"
OK = {"header": {"revision": "7"}, "kvs": []}
NO_LEADER = {"error": "etcdserver: no leader", "message": "etcdserver: no leader", "code": 14}
CLOSING = {"error": "grpc: the client connection is closing", "code": 1}


class Members:
    """Each member is ``ok``, ``frozen``, ``refused``, ``leaderless`` or ``stopping``."""

    def __init__(self, **states: str) -> None:
        self.states = states
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.seen.append((host, dict(request.headers)))
        state = self.states.get(host, "ok")
        if state == "frozen":
            await trio.sleep_forever()
        if state == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if state == "leaderless":
            return httpx.Response(503, json=NO_LEADER)
        if state == "stopping":
            return httpx.Response(408, json=CLOSING)
        if request.url.path == "/v3/lease/grant":
            return httpx.Response(200, json={"ID": "42", "TTL": "5"})
        if request.url.path == "/v3/lease/keepalive":
            return httpx.Response(200, json={"result": {"ID": "42", "TTL": "5"}})
        return httpx.Response(200, json=OK)


def registry(members: Members, endpoints: list[str]) -> EtcdRegistry:
    reg = EtcdRegistry(endpoints)
    reg._client = httpx.AsyncClient(transport=httpx.MockTransport(members))
    return reg


async def timed(call: Callable[[], object]) -> float:
    start = trio.current_time()
    await call()  # type: ignore[misc]
    return trio.current_time() - start


async def test_a_frozen_member_costs_one_attempt_bound(autojump_clock: object) -> None:
    reg = registry(Members(a="frozen"), [A, B])
    assert await timed(lambda: reg.get("/k")) == pytest.approx(ATTEMPT_TIMEOUT)
    assert await timed(lambda: reg.get("/k")) == 0  # b is current now


async def test_a_member_that_failed_lately_is_tried_last(autojump_clock: object) -> None:
    reg = registry(Members(c="refused"), [A, B, C])
    reg._order.current = 2
    assert reg._order.rotation() == [C, A, B]
    reg.endpoint_failed(A)
    assert reg._order.rotation() == [C, B, A]
    await trio.sleep(FAILED_ENDPOINT_LAST_FOR)
    assert reg._order.rotation() == [C, A, B]
    await reg.get("/k")  # c refuses, a answers: a is current and no longer failed
    assert reg._order.rotation() == [A, B, C]


async def test_the_bound_is_a_fifth_of_the_shortest_lease(autojump_clock: object) -> None:
    members = Members()
    reg = registry(members, [A, B])
    lease = await reg.grant(5)
    members.states["a"] = "frozen"
    assert await timed(lambda: reg.keepalive(lease)) == pytest.approx(1.0)


async def test_a_lease_ttl_known_at_start_bounds_the_first_call(autojump_clock: object) -> None:
    reg = EtcdRegistry([A, B], lease_ttl=5)
    reg._client = httpx.AsyncClient(transport=httpx.MockTransport(Members(a="frozen")))
    assert await timed(lambda: reg.get("/k")) == pytest.approx(1.0)


async def test_a_member_without_a_leader_is_left_at_once(autojump_clock: object) -> None:
    members = Members(a="leaderless")
    reg = registry(members, [A, B])
    assert await timed(lambda: reg.get("/k")) == 0
    assert [host for host, _ in members.seen] == ["a", "b"]
    assert all(h.get("grpc-metadata-hasleader") == "true" for _, h in members.seen)


async def test_a_stopping_member_is_unavailable_not_a_refusal(autojump_clock: object) -> None:
    members = Members(a="stopping")
    reg = registry(members, [A, B])
    assert await reg.keepalive(42) == 5
    members.states["b"] = "stopping"
    with pytest.raises(RegistryUnavailable, match="connection is closing"):
        await reg.keepalive(42)


async def test_one_endpoint_is_tried_again_with_the_whole_timeout(autojump_clock: object) -> None:
    members = Members(a="frozen")
    reg = registry(members, [A])
    with pytest.raises(RegistryUnavailable, match="no answer within 2 s.*no answer within 5 s"):
        await reg.get("/k")
    assert len(members.seen) == 2


# --- the watch ----------------------------------------------------------------------


def event_line(revision: int) -> str:
    kv = {"key": "L20vYQ==", "value": "", "mod_revision": str(revision)}
    return json.dumps({"result": {"events": [{"type": "PUT", "kv": kv}]}})


class Streams:
    """A fake ``WatchOpener``: each open gets a channel the test writes lines to."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.opened: list[tuple[str, int]] = []
        self.opened_at: list[float] = []
        self.channels: list[trio.MemorySendChannel[str | None]] = []
        self.unhealthy: set[str] = set()
        self.failed: list[str] = []
        self.end_at_once = False
        self.requests: list[dict[str, object]] = []
        self.checks: list[float] = []
        self.keys = 4
        """What a check counts under the watched prefix (the mesh's members)."""
        self.quiet_hints = QuietHints()

    @property
    def endpoint_count(self) -> int:
        return len(self.endpoints)

    async def open_watch_stream(
        self, stack: AsyncExitStack, body: dict[str, object]
    ) -> tuple[str, AsyncIterator[str]]:
        request = body["create_request"]
        assert isinstance(request, dict)
        self.requests.append(request)
        healthy = [e for e in self.endpoints if e not in self.failed[-1:]]
        endpoint = healthy[0]
        self.opened.append((endpoint, int(request["start_revision"])))
        self.opened_at.append(trio.current_time())
        send, receive = trio.open_memory_channel[str | None](10)
        self.channels.append(send)

        async def lines() -> AsyncIterator[str]:
            if self.end_at_once:
                return
            async for line in receive:
                if line is None:
                    return
                yield line

        return endpoint, lines()

    async def member_serves(
        self, endpoint: str, request: dict[str, object]
    ) -> tuple[str | None, int]:
        self.checks.append(trio.current_time())
        assert request["range_end"] == "L20w"  # the count covers the whole prefix
        return ("it is frozen", 0) if endpoint in self.unhealthy else (None, self.keys)

    def endpoint_failed(self, endpoint: str) -> None:
        self.failed.append(endpoint)


@asynccontextmanager
async def watching(streams: Streams, start: int) -> AsyncIterator[AsyncIterator[object]]:
    request = {"key": "L20v", "range_end": "L20w"}
    async with resuming_watch(streams, request, start) as lines:
        yield _watch_events(lines)


async def test_a_quiet_watch_on_a_frozen_member_resumes_elsewhere(autojump_clock: object) -> None:
    streams = Streams([A, B])
    async with watching(streams, 5) as events:
        await streams.channels[0].send(event_line(6))
        assert (await anext(events))[0].mod_revision == 6  # type: ignore[index]
        streams.unhealthy.add(A)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_when_moved, streams, event_line(7))
            assert (await anext(events))[0].mod_revision == 7  # type: ignore[index]
    assert streams.opened == [(A, 5), (B, 7)]
    assert streams.opened_at[1] - start == pytest.approx(QUIET_CHECK)


async def send_when_moved(streams: Streams, line: str) -> None:
    while len(streams.channels) < 2:
        await trio.sleep(0.1)
    await streams.channels[1].send(line)


async def test_a_quiet_watch_on_a_healthy_member_stays(autojump_clock: object) -> None:
    streams = Streams([A, B])
    async with watching(streams, 1) as events:
        with trio.move_on_after(10 * QUIET_CHECK):
            await anext(events)
    assert streams.opened == [(A, 1)]


PROGRESS = json.dumps({"result": {"header": {"revision": "9", "raft_term": "2"}}})
"""A progress notification as etcd 3.4.23's JSON gateway sends it: a header only."""


async def notify_every(streams: Streams, index: int, gap: float, count: int) -> None:
    for _ in range(count):
        await trio.sleep(gap)
        await streams.channels[index].send(PROGRESS)


async def test_progress_notifications_keep_a_live_watch_from_costing_reads(
    autojump_clock: object,
) -> None:
    streams = Streams([A, B])
    delivered: list[str] = []
    request = {"key": "L20v", "range_end": "L20w"}
    async with resuming_watch(streams, request, 1) as lines:
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                async for line in lines:
                    delivered.append(line)

            nursery.start_soon(consume)
            await notify_every(streams, 0, 2.0, 30)  # a live member's, 2 s apart: 60 s
            await streams.channels[0].send(event_line(10))
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    assert streams.requests[0]["progress_notify"] is True
    assert streams.checks == []
    assert delivered == [event_line(10)]  # the notifications are not handed on
    assert streams.opened == [(A, 1)]


async def test_a_check_due_while_the_loop_was_busy_waits_for_what_came_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams = Streams([A, B])
    request = {"key": "L20v", "range_end": "L20w"}
    async with resuming_watch(streams, request, 1) as lines:
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                async for _line in lines:
                    pass

            nursery.start_soon(consume)
            await notify_every(streams, 0, 2.0, 3)  # the gap is learnt: checks after 3 s
            await trio.sleep(2.9)
            # The loop is busy for a second past the check's time, and the member's next
            # notification came meanwhile: it waits in the stream, behind the loop.
            autojump_clock.jump(1.0)
            await streams.channels[0].send(PROGRESS)
            await notify_every(streams, 0, 2.0, 3)
            nursery.cancel_scope.cancel()
    assert streams.checks == []
    assert streams.opened == [(A, 1)]


async def test_a_frozen_member_stops_its_notifications_and_is_left(
    autojump_clock: object,
) -> None:
    streams = Streams([A, B])
    streams.keys = 1024  # unnotified, the checks would be 38-51 s apart
    async with watching(streams, 1) as events:
        async with trio.open_nursery() as nursery:

            async def live_then_frozen() -> None:
                await notify_every(streams, 0, 5.0, 12)  # an operator's 5 s interval
                streams.unhealthy.add(A)
                frozen_at.append(trio.current_time())
                nursery.cancel_scope.deadline = trio.current_time() + 60
                await send_when_moved(streams, event_line(2))

            frozen_at: list[float] = []
            nursery.start_soon(live_then_frozen)
            assert (await anext(events))[0].mod_revision == 2  # type: ignore[index]
            nursery.cancel_scope.cancel()
    assert streams.opened == [(A, 1), (B, 1)]
    assert streams.opened_at[1] - frozen_at[0] == pytest.approx(7.5)  # 1.5 notification gaps
    assert streams.requests[1]["progress_notify"] is True


async def test_unnotified_checks_of_a_large_mesh_are_spaced_by_its_size(
    autojump_clock: object,
) -> None:
    streams = Streams([A, B])
    streams.keys = 1024
    async with watching(streams, 1) as events:
        with trio.move_on_after(600):
            await anext(events)
    spaced = 1024 / REST_READS
    gaps = [b - a for a, b in zip(streams.checks, streams.checks[1:], strict=False)]
    assert streams.checks[0] == pytest.approx(QUIET_CHECK)  # the count is not known before
    assert len(gaps) >= 600 / spaced - 2
    assert all(0.75 * spaced - 1e-6 <= gap <= spaced + 1e-6 for gap in gaps), gaps
    assert len(set(gaps)) > 1  # jittered
    assert streams.opened == [(A, 1)]


async def test_the_next_stream_starts_from_what_the_last_one_learnt(
    autojump_clock: object,
) -> None:
    streams = Streams([A, B])
    streams.keys = 1024
    async with watching(streams, 1) as events:
        with trio.move_on_after(60):  # the first check counts the mesh
            await anext(events)
    assert len(streams.checks) == 2  # at 3 s, then once within 38-51 s
    async with watching(streams, 1) as events:  # the watcher's restart
        with trio.move_on_after(30):
            await anext(events)
    assert len(streams.checks) == 2  # no 3 s check on the new stream


def test_the_quiet_check_follows_the_notifications_and_the_mesh() -> None:
    assert quiet_check(4, None) == QUIET_CHECK
    assert quiet_check(1024, None) == 1024 / REST_READS
    assert quiet_check(1024, 2.0) == QUIET_CHECK
    assert quiet_check(1024, 5.0) == 7.5
    assert quiet_check(4, 600.0) == QUIET_CHECK  # etcd's default: the plain check
    assert quiet_check(1024, 600.0) == 1024 / REST_READS


async def test_a_watch_whose_member_lost_its_leader_resumes_elsewhere(
    autojump_clock: object,
) -> None:
    streams = Streams([A, B])
    async with watching(streams, 3) as events:
        await streams.channels[0].send(event_line(3))
        await anext(events)
        error = {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader"}
        await streams.channels[0].send(json.dumps({"error": error}))
        with trio.move_on_after(0.5):
            await anext(events)
    assert streams.opened == [(A, 3), (B, 4)]


async def test_streams_that_keep_ending_give_up(autojump_clock: object) -> None:
    streams = Streams([A, B])
    streams.end_at_once = True
    with pytest.raises(RegistryUnavailable, match="no member kept the stream"):
        async with watching(streams, 1) as events:
            await anext(events)
    assert len(streams.opened) == 3
