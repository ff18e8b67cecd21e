"""The ``Registry`` contract: every implementation must pass all of it.

Each test runs against ``MemoryRegistry`` (virtual time) and ``EtcdRegistry``
on a real etcd at 127.0.0.1 (real time); every wait is bounded.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing

from vnetd.errors import RegistryError, RegistryUnavailable, WatchCompacted
from vnetd.lab.etcd import run_etcd
from vnetd.registry.base import Registry, WatchEvent
from vnetd.registry.bounds import MAX_KEY_KEPT, MAX_VALUE_KEPT, dropped_size, kept_key, kept_value
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import JSON
from vnetd.registry.etcd.pages import PAGE_KEYS
from vnetd.registry.memory import MemoryRegistry

if TYPE_CHECKING:
    from tests.contract.conftest import Backend

BOUND = 10.0  # seconds; etcd's lease expiry takes up to ~2 s of real time
STORES = ["memory", "etcd"]
"""The backends that store: compaction and paged lists are theirs, not a relay's."""


async def take(batches: AsyncIterator[list[WatchEvent]], count: int) -> list[WatchEvent]:
    """The next ``count`` events (from whole batches), failing after ``BOUND`` s."""
    taken: list[WatchEvent] = []
    with trio.fail_after(BOUND):
        async for batch in batches:
            assert batch, "an empty batch"
            taken += batch
            if len(taken) >= count:
                break
    return taken[:count]


async def test_create_if_absent(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        assert await registry.create("m/spec", b"one") is None
        created = await registry.get("m/spec")
        assert created is not None
        assert (created.key, created.value, created.lease) == ("m/spec", b"one", 0)
        assert created.create_revision == created.mod_revision > 0

        existing = await registry.create("m/spec", b"two")
        assert existing == created
        assert await registry.get("m/spec") == created
        assert await registry.get("m/absent") is None


async def test_create_all_writes_every_key_or_none(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        assert await registry.create_all({"m/assign/a": b"0", "m/rank/0": b"a"}) is True
        got = [(kv.key, kv.value, kv.lease) for kv in (await registry.list_prefix("m/"))[0]]
        assert got == [("m/assign/a", b"0", 0), ("m/rank/0", b"a", 0)]

        # One key exists: nothing is written, not even the free one.
        assert await registry.create_all({"m/assign/b": b"0", "m/rank/0": b"b"}) is False
        assert await registry.get("m/assign/b") is None
        assert (await registry.get("m/rank/0")).value == b"a"  # type: ignore[union-attr]


async def test_replace_checks_mod_revision(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        await registry.create("m/k", b"v1")
        first = await registry.get("m/k")
        assert first is not None

        assert await registry.replace("m/k", b"v2", first.mod_revision)
        second = await registry.get("m/k")
        assert second is not None
        assert second.value == b"v2"
        assert second.create_revision == first.create_revision
        assert second.mod_revision > first.mod_revision

        assert not await registry.replace("m/k", b"v3", first.mod_revision)
        assert await registry.get("m/k") == second


async def test_list_prefix_is_sorted_with_revision(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        for key in ["m/members/3", "m/members/1", "m/membersX", "m/members/2", "n/members/1"]:
            await registry.create(key, key.encode())
        kvs, revision = await registry.list_prefix("m/members/")
        assert [kv.key for kv in kvs] == ["m/members/1", "m/members/2", "m/members/3"]
        assert [kv.value for kv in kvs] == [b"m/members/1", b"m/members/2", b"m/members/3"]
        last = await registry.get("n/members/1")
        assert last is not None
        assert revision == last.mod_revision

        empty, same = await registry.list_prefix("nothing/")
        assert (empty, same) == ([], revision)


async def test_delete(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        await registry.create("m/k", b"v")
        assert await registry.delete("m/k")
        assert await registry.get("m/k") is None
        assert not await registry.delete("m/k")
        assert await registry.create("m/k", b"again") is None


async def test_revoke_deletes_bound_keys_and_watchers_see_it(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        lease = await registry.grant(30)
        assert 0 < await registry.keepalive(lease) <= 30
        await registry.create("m/members/1", b"a", lease=lease)
        await registry.create("m/members/2", b"b", lease=lease)
        await registry.create("m/members/3", b"c")
        bound = await registry.get("m/members/1")
        assert bound is not None
        assert bound.lease == lease
        _, revision = await registry.list_prefix("m/")

        async with registry.watch("m/", revision + 1) as events:
            await registry.revoke(lease)
            deleted = await take(events, 2)

        assert {(e.kind, e.key) for e in deleted} == {
            ("delete", "m/members/1"),
            ("delete", "m/members/2"),
        }
        assert all(e.mod_revision > revision for e in deleted)
        kvs, _ = await registry.list_prefix("m/")
        assert [kv.key for kv in kvs] == ["m/members/3"]
        assert await registry.keepalive(lease) == 0
        await registry.revoke(lease)  # unknown leases are ignored


async def test_unknown_lease_is_refused(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        lease = await registry.grant(30)
        await registry.revoke(lease)
        with pytest.raises(RegistryError) as caught:
            await registry.create("m/k", b"v", lease=lease)
        assert not isinstance(caught.value, RegistryUnavailable)
        assert await registry.get("m/k") is None


async def test_lease_expiry_deletes_keys(
    registry: Registry, backend_clock: trio.testing.MockClock | None
) -> None:
    with trio.fail_after(BOUND):
        lease = await registry.grant(1)
        await registry.create("m/members/1", b"a", lease=lease)
        _, revision = await registry.list_prefix("m/")
        async with registry.watch("m/", revision + 1) as events:
            # Nobody else calls the registry: the watch alone must see the expiry.
            [gone] = await take(events, 1)
        assert (gone.kind, gone.key) == ("delete", "m/members/1")
        assert await registry.get("m/members/1") is None
        assert await registry.keepalive(lease) == 0


async def test_keepalive_keeps_keys(
    registry: Registry, backend_clock: trio.testing.MockClock | None
) -> None:
    with trio.fail_after(BOUND):
        lease = await registry.grant(2)
        await registry.create("m/members/1", b"a", lease=lease)
        for _ in range(6):  # 3 s in all, longer than the TTL
            await trio.sleep(0.5)
            assert await registry.keepalive(lease) > 0
        assert await registry.get("m/members/1") is not None


async def test_watch_replays_from_a_past_revision(registry: Registry) -> None:
    with trio.fail_after(BOUND):
        await registry.create("m/a", b"1")
        first = await registry.get("m/a")
        assert first is not None
        await registry.create("other/x", b"ignored")
        await registry.create("m/b", b"2")
        await registry.delete("m/a")

        async with registry.watch("m/", first.mod_revision) as events:
            await registry.create("m/c", b"3")
            seen = await take(events, 4)

        assert [(e.kind, e.key, e.value) for e in seen] == [
            ("put", "m/a", b"1"),
            ("put", "m/b", b"2"),
            ("delete", "m/a", b""),
            ("put", "m/c", b"3"),
        ]
        revisions = [e.mod_revision for e in seen]
        assert revisions == sorted(set(revisions))
        assert revisions[0] == first.mod_revision


async def test_a_resumed_watch_gets_the_pending_revisions_in_one_batch(registry: Registry) -> None:
    """etcd sends a watcher behind the store up to 1000 revisions per message: the
    member watch leans on that to take a join storm in batches."""
    with trio.fail_after(BOUND):
        _, revision = await registry.list_prefix("m/")
        for i in range(5):
            await registry.create(f"m/{i}", b"v")
        async with registry.watch("m/", revision + 1) as batches:
            first = await batches.__anext__()
        assert [e.key for e in first] == [f"m/{i}" for i in range(5)]


async def test_watch_events_carry_the_create_revision(registry: Registry) -> None:
    """A put keeps its key's create revision until the key is deleted and created again;
    a delete carries none. (Readers keep the earliest registration of a public key.)"""
    with trio.fail_after(BOUND):
        await registry.create("m/a", b"1")
        first = await registry.get("m/a")
        assert first is not None
        async with registry.watch("m/", first.mod_revision) as events:
            assert await registry.replace("m/a", b"2", first.mod_revision)
            await registry.delete("m/a")
            await registry.create("m/a", b"3")
            seen = await take(events, 4)
        again = await registry.get("m/a")
        assert again is not None

        assert [(e.kind, e.value, e.create_revision) for e in seen] == [
            ("put", b"1", first.create_revision),
            ("put", b"2", first.create_revision),
            ("delete", b"", 0),
            ("put", b"3", again.create_revision),
        ]
        assert again.create_revision == again.mod_revision == seen[3].mod_revision
        assert again.create_revision > first.create_revision


async def test_watch_events_carry_the_lease(registry: Registry) -> None:
    """A put carries the lease it bound its key to (0 for none, and for a delete):
    readers tell a claim (always under a lease) from a leaseless write."""
    with trio.fail_after(BOUND):
        lease = await registry.grant(30)
        _, revision = await registry.list_prefix("m/")
        async with registry.watch("m/", revision + 1) as events:
            await registry.create("m/a", b"1", lease=lease)
            current = await registry.get("m/a")
            assert current is not None
            assert await registry.replace("m/a", b"2", current.mod_revision)
            await registry.delete("m/a")
            seen = await take(events, 3)
        await registry.revoke(lease)

        assert [(e.kind, e.value, e.lease) for e in seen] == [
            ("put", b"1", lease),
            ("put", b"2", 0),
            ("delete", b"", 0),
        ]


@pytest.mark.parametrize("backend_name", STORES)
async def test_watch_from_compacted_revision(backend: Backend) -> None:
    """The stores' compaction; a relay answers 'compacted' by its own window instead
    (tests/unit/test_relay_cache.py)."""
    registry = backend.registry
    with trio.fail_after(BOUND):
        for i in range(3):
            await registry.create(f"m/{i}", b"v")
        _, revision = await registry.list_prefix("m/")
        await backend.compact(revision)

        with pytest.raises(WatchCompacted) as caught:
            async with registry.watch("m/", 1) as events:
                await take(events, 1)
        assert caught.value.compact_revision == revision

        # The compacted revision itself is still kept.
        async with registry.watch("m/", revision) as events:
            [event] = await take(events, 1)
        assert (event.key, event.mod_revision) == ("m/2", revision)


async def test_unreachable_backend_fails_fast(backend: Backend) -> None:
    down = backend.unreachable()
    try:
        with trio.fail_after(3):
            with pytest.raises(RegistryUnavailable):
                await down.get("m/k")
            with pytest.raises(RegistryUnavailable):
                await down.grant(5)
            with pytest.raises(RegistryUnavailable):
                async with down.watch("m/", 1) as events:
                    await take(events, 1)
    finally:
        await down.aclose()


async def test_outage_breaks_watch_then_recovers(backend: Backend) -> None:
    registry = backend.registry
    with trio.fail_after(BOUND * 2):
        await registry.create("m/a", b"1")
        _, revision = await registry.list_prefix("m/")
        async with registry.watch("m/", revision + 1) as events:
            await backend.outage()
            with pytest.raises(RegistryUnavailable):
                await take(events, 1)
        with pytest.raises(RegistryUnavailable):
            await registry.get("m/a")

        await backend.recover()
        kept = await registry.get("m/a")
        assert kept is not None
        assert kept.value == b"1"
        async with registry.watch("m/", revision + 1) as events:
            await registry.create("m/b", b"2")
            [event] = await take(events, 1)
        assert (event.kind, event.key) == ("put", "m/b")


async def test_etcd_rotates_past_a_dead_endpoint(tmp_path: Path) -> None:
    """EtcdRegistry only: a dead first endpoint costs one refused connect."""
    async with run_etcd(tmp_path / "etcd") as server:
        registry = EtcdRegistry(["http://127.0.0.1:1", server.url], timeout=2)
        try:
            with trio.fail_after(BOUND):
                assert await registry.create("m/k", b"v") is None
                async with registry.watch("m/", 1) as events:
                    [event] = await take(events, 1)
                assert event.key == "m/k"
        finally:
            await registry.aclose()


async def test_reads_keep_bounded_keys_and_values(registry: Registry) -> None:
    """docs/architecture.md, "Bounded reads": a long key is cut and tagged the same way by
    every read (so its delete event names it as its list did), a long value becomes a
    marker that keeps its size."""
    long_key = "m/members/" + "x" * (MAX_KEY_KEPT + 10)
    big = b"v" * (MAX_VALUE_KEPT + 1)
    with trio.fail_after(BOUND):
        await registry.create("m/members/1", b"small")
        start = (await registry.list_prefix("m/"))[1] + 1
        await registry.create("m/members/2", big)
        await registry.create(long_key, b"{}")
        kvs, _ = await registry.list_prefix("m/")
        by_key = {kv.key: kv.value for kv in kvs}
        cut = kept_key(long_key)
        assert len(cut) < MAX_KEY_KEPT and cut.startswith("m/members/xxx")
        assert by_key == {"m/members/1": b"small", "m/members/2": kept_value(big), cut: b"{}"}
        assert dropped_size(by_key["m/members/2"]) == len(big)
        assert dropped_size(b"small") is None
        got = await registry.get("m/members/2")
        assert got is not None and got.value == kept_value(big)
        assert await registry.delete(long_key)
        async with registry.watch("m/", start) as batches:
            events = await take(batches, 3)
        assert [(e.kind, e.key, e.value) for e in events] == [
            ("put", "m/members/2", kept_value(big)),
            ("put", cut, b"{}"),
            ("delete", cut, b""),
        ]


async def test_a_list_larger_than_a_page_is_complete_and_consistent(registry: Registry) -> None:
    """More keys than one page holds, and values that overflow a page's bytes: every key
    comes back once, in order (``registry.etcd.pages``)."""
    count = PAGE_KEYS + 300
    with trio.fail_after(60):
        for first in range(0, count, 100):
            await registry.create_all(
                {f"m/k/{i:05d}": b"x" for i in range(first, min(count, first + 100))}
            )
        for i in range(8):  # 8 x 1.3 MiB of base64: over one page's bytes
            await registry.create(f"m/v/{i}", b"y" * (1024 * 1024))
        kvs, revision = await registry.list_prefix("m/")
    assert [kv.key for kv in kvs] == [f"m/k/{i:05d}" for i in range(count)] + [
        f"m/v/{i}" for i in range(8)
    ]
    assert all(kv.mod_revision <= revision for kv in kvs)


def stop_lists_part_way(registry: Registry) -> Callable[[bool], None]:
    """A switch that makes lists stop with no answer: etcd's after their first page (each
    later page has no answer, as under heavy load), the fake's whole (it reads at once)."""
    if isinstance(registry, EtcdRegistry):
        post = registry._post
        stopped = [False]

        async def no_answer_after_the_first_page(path: str, body: JSON, *rest: Any) -> JSON:  # noqa: ANN401
            if stopped[0] and path == "/v3/kv/range" and "revision" in body:
                raise RegistryUnavailable("etcd /v3/kv/range: no answer (the test's)")
            return await post(path, body, *rest)

        registry._post = no_answer_after_the_first_page  # type: ignore[method-assign]
        return lambda on: stopped.__setitem__(0, on)
    assert isinstance(registry, MemoryRegistry)
    return registry.fail


@pytest.mark.parametrize("backend_name", STORES)
async def test_a_list_asked_again_after_it_stopped_is_one_snapshot_a_watch_completes(
    backend: Backend,
) -> None:
    """A list that stopped for want of an answer and is asked again returns one snapshot
    (every key of one revision), and a watch from that revision brings it up to date. On
    etcd the list resumes at its last page: the snapshot is the stopped list's revision,
    with none of the writes made since (``registry.etcd.pages``)."""
    if backend.name == "relay":
        pytest.skip("a relay lists from memory; a list it cannot serve goes to etcd")
    registry = backend.registry
    stop = stop_lists_part_way(registry)
    with trio.fail_after(60):
        for i in range(6):  # 800 KiB of base64 each: one key a page after the first page
            await registry.create(f"m/{i}", f"{i}".encode() * (600 * 1024))
        _, written = await registry.list_prefix("m/")
        stop(True)
        with pytest.raises(RegistryUnavailable):
            await registry.list_prefix("m/")
        stop(False)
        await registry.create("m/9", b"new")
        before = await registry.get("m/0")
        assert before is not None
        assert await registry.replace("m/0", b"changed", before.mod_revision)
        kvs, revision = await registry.list_prefix("m/")
        state = {kv.key: kv.value for kv in kvs}
        assert all(kv.mod_revision <= revision for kv in kvs)
        changes = 2 if revision == written else 0
        if changes:  # resumed: the stopped list's snapshot; the watch brings the two writes
            async with registry.watch("m/", revision + 1) as events:
                for event in await take(events, changes):
                    state[event.key] = event.value
        assert sorted(state) == [*(f"m/{i}" for i in range(6)), "m/9"]
        assert (state["m/0"], state["m/9"]) == (b"changed", b"new")
    if isinstance(registry, EtcdRegistry):
        assert revision == written  # it resumed


async def test_etcd_a_stopped_list_whose_revision_was_compacted_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EtcdRegistry only: the stopped list's revision compacted before it is asked
    again: it starts over from its first page, says so, and the result is current."""
    async with run_etcd(tmp_path / "etcd") as server:
        registry = EtcdRegistry([server.url], timeout=2)
        stop = stop_lists_part_way(registry)
        try:
            with trio.fail_after(60):
                for i in range(4):
                    await registry.create(f"m/{i}", b"v" * (600 * 1024))
                stop(True)
                with pytest.raises(RegistryUnavailable):
                    await registry.list_prefix("m/")
                stop(False)
                await registry.create("m/9", b"new")
                _, now = await registry.list_prefix("n/")
                async with httpx.AsyncClient(timeout=5) as client:
                    compacted = await client.post(
                        f"{server.url}/v3/kv/compaction", json={"revision": str(now)}
                    )
                compacted.raise_for_status()
                with caplog.at_level(logging.INFO):
                    kvs, revision = await registry.list_prefix("m/")
            assert revision == now
            assert [kv.key for kv in kvs] == ["m/0", "m/1", "m/2", "m/3", "m/9"]
            assert "resuming after page 1" in caplog.text
            assert "was compacted after page 1; starting over from the first page" in caplog.text
        finally:
            await registry.aclose()
