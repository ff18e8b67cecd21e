"""Paged lists (``registry/etcd/pages``) against a fake range call: a list that stops
for want of an answer resumes at its last page and revision, starts over when that
revision was compacted or the list is too old, and a page of big values gets more
time (docs/architecture.md, "Bounded reads"). The same against real etcd is in
tests/contract/test_registry.py.
"""

from __future__ import annotations

import base64
import logging
from functools import partial

import pytest
import trio
import trio.testing

from vnetd.errors import RegistryUnavailable
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import JSON, GatewayRanges
from vnetd.registry.etcd.pages import (
    MISS_TIME,
    OUT_OF_RANGE,
    PAGE_BYTES,
    PAGE_TIME_CAP,
    RESUME_WITHIN,
    SLOW_RATE,
    ListResumes,
    list_pages,
)
from vnetd.registry.etcd.transport import Refused

PREFIX = "m/"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class FakeRange:
    """A store at ``revision`` (``later`` holds what was written since), answering
    range requests as etcd's gateway does; ``fail`` makes calls have no answer."""

    def __init__(self, values: dict[str, bytes], revision: int = 50) -> None:
        self.values = dict(values)
        self.revision = revision
        self.later: dict[str, bytes] = {}
        self.compacted = 0
        self.fail: set[int] = set()
        """Numbers (from 1) of the calls that get no answer."""
        self.calls: list[tuple[JSON, float]] = []

    async def __call__(self, path: str, body: JSON, cap: int, extra: float) -> JSON:
        assert path == "/v3/kv/range"
        self.calls.append((body, extra))
        if len(self.calls) in self.fail:
            raise RegistryUnavailable("no answer within 5 s")
        at = int(body.get("revision", 0))
        if at and at < self.compacted:
            raise Refused("etcdserver: mvcc: required revision has been compacted", OUT_OF_RANGE)
        store = self.values if at and at <= self.revision else {**self.values, **self.later}
        start = base64.b64decode(body["key"]).decode()
        keys = sorted(k for k in store if k >= start and k.startswith(PREFIX))
        limit = int(body["limit"])
        page = keys[:limit]
        kvs = [{"key": b64(k.encode()), "value": b64(store[k]), "mod_revision": "2"} for k in page]
        revision = at or (self.revision + (1 if self.later else 0))
        return {"header": {"revision": str(revision)}, "kvs": kvs, "more": len(keys) > limit}

    def starts(self) -> list[tuple[str, int]]:
        """(first key, revision) of each call."""
        return [
            (base64.b64decode(body["key"]).decode(), int(body.get("revision", 0)))
            for body, _ in self.calls
        ]


VALUES = {f"m/{i:02d}": b"x" * 100 for i in range(12)}


async def test_a_list_that_stopped_resumes_at_its_page_and_revision(caplog) -> None:
    store = FakeRange(VALUES)
    resumes = ListResumes()
    # Call 1 is the first page (2 keys), 2 the rest: it gets no answer three times.
    store.fail = {2, 3, 4}
    with trio.fail_after(5), pytest.raises(RegistryUnavailable):
        await list_pages(GatewayRanges(store), PREFIX, resumes)
    assert len(store.calls) == 4 and len(resumes) == 1
    store.later = {"m/00b": b"new", "m/99": b"new"}  # written after the snapshot
    with caplog.at_level(logging.INFO), trio.fail_after(5):
        kvs, revision = await list_pages(GatewayRanges(store), PREFIX, resumes)
    # The resumed list asks for the page after the first, at the first page's revision:
    assert store.starts()[4] == ("m/01\0", 50)  # the key after the last one read
    assert len(store.calls) == 5
    assert "resuming after page 1 (2 keys, revision 50)" in caplog.text
    # ... so the result is the snapshot at revision 50, complete and in order.
    assert (revision, [kv.key for kv in kvs]) == (50, sorted(VALUES))
    assert len(resumes) == 0


async def test_a_resume_at_a_compacted_revision_starts_over_and_says_so(caplog) -> None:
    store = FakeRange(VALUES)
    resumes = ListResumes()
    store.fail = {2, 3, 4}
    with pytest.raises(RegistryUnavailable):
        await list_pages(GatewayRanges(store), PREFIX, resumes)
    store.later = {"m/99": b"new"}
    store.compacted = 51
    with caplog.at_level(logging.INFO), trio.fail_after(5):
        kvs, revision = await list_pages(GatewayRanges(store), PREFIX, resumes)
    assert store.starts()[4:6] == [("m/01\0", 50), ("m/", 0)]
    assert "revision 50 was compacted after page 1; starting over from the first page" in (
        caplog.text
    )
    assert (revision, [kv.key for kv in kvs]) == (51, [*sorted(VALUES), "m/99"])


async def test_a_list_stopped_too_long_ago_starts_over(autojump_clock, caplog) -> None:
    store = FakeRange(VALUES)
    resumes = ListResumes()
    store.fail = {2, 3, 4}
    with pytest.raises(RegistryUnavailable):
        await list_pages(GatewayRanges(store), PREFIX, resumes)
    await trio.sleep(RESUME_WITHIN + 1)
    with caplog.at_level(logging.INFO):
        _, revision = await list_pages(GatewayRanges(store), PREFIX, resumes)
    assert store.starts()[4] == ("m/", 0)
    assert "too old to resume; starting over" in caplog.text


async def test_without_resumes_every_list_starts_at_its_first_page() -> None:
    store = FakeRange(VALUES)
    store.fail = {2, 3, 4}
    with pytest.raises(RegistryUnavailable):
        await list_pages(GatewayRanges(store), PREFIX)
    await list_pages(GatewayRanges(store), PREFIX)
    assert store.starts()[4] == ("m/", 0)


async def test_a_page_of_big_values_gets_time_for_its_bytes() -> None:
    big = {f"m/{i:02d}": b"y" * (1400 * 1024) for i in range(4)}
    store = FakeRange(big)
    await list_pages(GatewayRanges(store), PREFIX)
    extras = [extra for _, extra in store.calls]
    assert extras[0] == 0.0  # the first page: nothing known yet
    # Each next page: its keys (one at this size) at SLOW_RATE, about 7 s.
    per_key = len(b64(b"y" * (1400 * 1024))) + len(b64(b"m/00")) + 100
    assert extras[1:] == [pytest.approx(per_key / SLOW_RATE)] * (len(extras) - 1)
    assert 6.0 < extras[1] < 8.0


async def test_a_page_with_no_answer_is_asked_again_with_more_time_up_to_the_cap() -> None:
    store = FakeRange(VALUES)
    store.fail = {2, 3, 4, 5, 6, 7, 8}
    resumes = ListResumes()
    for _ in range(2):
        with pytest.raises(RegistryUnavailable):
            await list_pages(GatewayRanges(store), PREFIX, resumes)
    await list_pages(GatewayRanges(store), PREFIX, resumes)
    extras = [extra for _, extra in store.calls[1:]]
    # The first try: the usual bound (a page of small records is sized to PAGE_TARGET).
    assert extras[0] == 0.0
    assert extras[1:4] == [MISS_TIME, 2 * MISS_TIME, 4 * MISS_TIME]
    assert max(extras) == extras[-1] == PAGE_TIME_CAP  # the page answered at last


async def test_a_first_page_with_no_answer_gives_the_next_list_more_time() -> None:
    store = FakeRange(VALUES)
    store.fail = {1}
    resumes = ListResumes()
    with pytest.raises(RegistryUnavailable):
        await list_pages(GatewayRanges(store), PREFIX, resumes)
    assert len(store.calls) == 1  # a first page is not asked again: nothing to resume
    kvs, _ = await list_pages(GatewayRanges(store), PREFIX, resumes)
    assert store.starts()[1] == ("m/", 0) and store.calls[1][1] == MISS_TIME
    assert len(kvs) == len(VALUES)


async def slow_gateway(stream: trio.SocketStream, delay: float, answers: list[float]) -> None:
    """One HTTP request on ``stream``, answered with an empty page after ``delay`` s
    (as etcd's gateway sends a big page only once it has encoded all of it)."""
    request = b""
    while b"\r\n\r\n" not in request:
        request += await stream.receive_some(65536)
    head, _, body = request.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(body) < length:
        body += await stream.receive_some(65536)
    await trio.sleep(delay)
    page = b'{"header":{"revision":"7"},"kvs":[]}'
    await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(page), page))  # fmt: skip
    answers.append(delay)


async def test_a_page_given_more_time_gets_it_from_httpx_too() -> None:
    """httpx's own read timeout (the client's 0.5 s here) must not cut a page whose call
    was given more: before it was raised with the call's bound, every attempt at a big
    page ended at httpx's timeout whatever time the page was given. Real sockets on the
    loopback (httpx's timeouts live in its transport)."""
    answers: list[float] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                trio.serve_tcp, partial(slow_gateway, delay=1.0, answers=answers), 0
            )
            port = listeners[0].socket.getsockname()[1]
            registry = EtcdRegistry([f"http://127.0.0.1:{port}"], timeout=0.5)
            body = {"key": b64(b"m/"), "range_end": b64(b"m0"), "limit": "2"}
            try:
                with pytest.raises(RegistryUnavailable):
                    await registry._post("/v3/kv/range", body, PAGE_BYTES)
                data = await registry._post("/v3/kv/range", body, PAGE_BYTES, 2.0)
            finally:
                await registry.aclose()
            nursery.cancel_scope.cancel()
    assert data["header"]["revision"] == "7"
