"""``capped_lines``: a watch stream cut into lines, each bounded, and its messages
decoded event by event (docs/architecture.md, "Bounded reads")."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.etcd.gateway import capped_lines, next_message, watch_event, watch_events


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def lines_of(*parts: bytes, cap: int = 1024) -> list[str]:
    return [line async for line in capped_lines(chunks_of(*parts), cap)]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        pytest.param((b"a\nb\n",), ["a", "b"], id="two-lines-one-chunk"),
        pytest.param((b"ab", b"c\nd", b"e\n"), ["abc", "de"], id="lines-across-chunks"),
        pytest.param((b"a", b"b", b"c", b"\n"), ["abc"], id="newline-in-its-own-chunk"),
        pytest.param((b"a\n", b"tail"), ["a", "tail"], id="unterminated-tail"),
        pytest.param((b"\n\nx\n",), ["", "", "x"], id="empty-lines"),
    ],
)
async def test_lines_are_cut_at_newlines(parts: tuple[bytes, ...], expected: list[str]) -> None:
    assert await lines_of(*parts) == expected


async def test_a_line_over_the_cap_ends_the_stream() -> None:
    parts = (b"ok\n", *([b"x" * 100] * 20))
    seen: list[str] = []

    async def read_all() -> None:
        async for line in capped_lines(chunks_of(*parts), cap=1024):
            seen.append(line)

    with pytest.raises(RegistryUnavailable, match="over"):
        await read_all()
    assert seen == ["ok"]


async def test_many_small_chunks_of_one_long_line() -> None:
    parts = [b"y" * 16] * 4096 + [b"\nz\n"]
    assert await lines_of(*parts, cap=1 << 20) == ["y" * 16 * 4096, "z"]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def watch_line(*events: dict[str, object]) -> str:
    header = {"cluster_id": "1", "member_id": "2", "revision": "9", "raft_term": "3"}
    return json.dumps({"result": {"header": header, "events": list(events)}})


async def test_a_message_s_events_are_decoded_one_at_a_time_as_before() -> None:
    put = {"kv": {"key": b64("/m/members/1"), "value": b64("v"), "create_revision": "4",
                  "mod_revision": "7", "version": "2", "lease": "99"}}  # fmt: skip
    gone = {"type": "DELETE", "kv": {"key": b64("/m/members/2"), "mod_revision": "8"}}
    line = watch_line(put, gone)
    lines = chunks_of(line.encode() + b"\n")
    batch = await anext(watch_events(capped_lines(lines)))
    decoded = json.loads(line)["result"]["events"]  # the whole message's dicts, as before
    assert batch == [watch_event(event) for event in decoded]
    assert [(event.kind, event.lease) for event in batch] == [("put", 99), ("delete", 0)]


async def test_an_event_with_a_bad_revision_is_an_unusable_message() -> None:
    bad = {"kv": {"key": b64("/m/members/1"), "mod_revision": "seven"}}
    with pytest.raises(RegistryError, match="unusable message"):
        await next_message(capped_lines(chunks_of(watch_line(bad).encode() + b"\n")))
