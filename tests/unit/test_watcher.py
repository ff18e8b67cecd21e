"""sync_members heals on its own: compaction and outages lead to a fresh list."""

from __future__ import annotations

import base64
import logging
from functools import partial

import pytest
import trio
import trio.testing
from resettable import wipe
from shared import SPEC, create_leased

from vnetd.control.membership import encode_member, member_key
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import WATCH_RESTARTS, MemberView, sync_members
from vnetd.errors import WatchCompacted, WatchMoved
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec


def member(rank: int) -> Member:
    return Member(
        rank,
        base64.b64encode(bytes([rank + 1]) * 32).decode(),
        f"198.18.1.{rank}:51820",
        f"pod{rank}",
    )


class CompactedOnce(MemoryRegistry):
    """Its first watch fails as if the listed revision had been compacted."""

    def __init__(self) -> None:
        super().__init__()
        self.watches = 0

    def watch(self, prefix, start_revision):
        self.watches += 1
        if self.watches == 1:
            raise WatchCompacted(start_revision + 1)
        return super().watch(prefix, start_revision)


async def test_compacted_watch_lists_again_and_keeps_following(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="vnetd.watch")
    registry = CompactedOnce()
    await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await create_leased(registry, member_key(SPEC, 2), encode_member(member(2)))
        with trio.fail_after(5):
            while set(view.members) != {1, 2}:
                await trio.sleep(0.01)
        assert registry.watches == 2
        assert "listing members again" in caplog.text
        nursery.cancel_scope.cancel()


async def test_outage_keeps_view_then_relists(autojump_clock):
    registry = MemoryRegistry()
    await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))
    view = MemberView()
    health = RegistryHealth()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, health)
        with trio.fail_after(5):
            while 1 not in view.members:
                await trio.sleep(0.01)
        registry.fail(True)
        await trio.sleep(60)
        assert set(view.members) == {1}, "an outage must not empty the view"
        assert health.reachable is False
        registry.fail(False)
        await create_leased(registry, member_key(SPEC, 3), encode_member(member(3)))
        with trio.fail_after(10):
            while set(view.members) != {1, 3}:
                await trio.sleep(0.05)
        assert health.reachable is True
        nursery.cancel_scope.cancel()


async def test_deleting_a_junk_key_does_not_drop_a_member():
    registry = MemoryRegistry()
    view = MemberView()
    await create_leased(registry, member_key(SPEC, 2), encode_member(member(2)))
    kvs, revision = await registry.list_prefix("/vnetd/m/members/")
    view.replace(SPEC, kvs)
    junk = member_key(SPEC, 2).replace("/2", "/02")
    await registry.create(junk, b"{}")
    await registry.delete(junk)
    async with registry.watch("/vnetd/m/members/", revision + 1) as batches:
        async for batch in batches:
            view.apply_batch(SPEC, batch)
            if batch[-1].kind == "delete":
                break
    assert set(view.members) == {2}


async def wait_for(condition, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


async def test_reset_registry_holds_missing_members_then_drops_the_absent(autojump_clock, caplog):
    """A list below the highest revision seen is a reset: the members missing from it
    are kept for two lease TTLs (SPEC's is 10 s) or until they register again."""
    caplog.set_level(logging.INFO, logger="vnetd.watch")
    registry = MemoryRegistry()
    for rank in (1, 2, 3):
        await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await wait_for(lambda: set(view.members) == {1, 2, 3})
        assert view.revision == 4

        registry.fail(True)
        await trio.sleep(5)
        wipe(registry)
        registry.fail(False)
        await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))  # revision 2
        await wait_for(lambda: bool(view.held))
        reset_at = trio.current_time()
        assert set(view.members) == {1, 2, 3}
        assert set(view.held) == {2, 3}
        resets = [r.getMessage() for r in caplog.records if "registry was reset" in r.getMessage()]
        assert resets == [
            "registry was reset (revision 4 → 2): keeping 2 members for 20 s while they re-register"
        ]

        moved = Member(2, member(2).public_key, "198.18.9.2:51820", "pod2")
        await create_leased(registry, member_key(SPEC, 2), encode_member(moved))
        await wait_for(lambda: view.members[2] == moved)
        assert set(view.held) == {3}, "a member that registered again is no longer held"

        await trio.sleep(reset_at + 19.5 - trio.current_time())
        assert set(view.members) == {1, 2, 3}, "rank 3 is kept for the whole grace"
        await trio.sleep(1.0)
        assert set(view.members) == {1, 2}, "rank 3 did not come back: dropped after the grace"
        assert view.held == {}
        assert "rank 3 did not register again after the registry reset; dropped" in caplog.text
        assert len([r for r in caplog.records if "registry was reset" in r.getMessage()]) == 1
        nursery.cancel_scope.cancel()


async def test_list_after_an_outage_without_reset_drops_missing_members_at_once(
    autojump_clock, caplog
):
    """A member deleted while the watch was down is gone from a list whose revision
    went up: that is an ordinary deletion, not a reset, and nothing is held."""
    registry = MemoryRegistry()
    for rank in (1, 2):
        await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await wait_for(lambda: set(view.members) == {1, 2})
        registry.fail(True)
        await trio.sleep(5)
        registry.fail(False)
        await registry.delete(member_key(SPEC, 2))  # before the watcher lists again
        await wait_for(lambda: set(view.members) == {1}, timeout=10)
        assert view.held == {}
        assert "registry was reset" not in caplog.text
        nursery.cancel_scope.cancel()


async def test_a_list_during_the_grace_keeps_holding(autojump_clock):
    """Another outage (or a compaction) during the grace re-lists at a higher
    revision; the held members stay held until their deadline, not dropped."""
    registry = MemoryRegistry()
    for rank in (1, 2, 3):
        await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(sync_members, reset_grace=15.0), registry, SPEC, view, RegistryHealth()
        )
        await wait_for(lambda: set(view.members) == {1, 2, 3})
        registry.fail(True)
        await trio.sleep(1)  # the open watch breaks, as a stopped etcd's stream does
        wipe(registry)
        registry.fail(False)
        await wait_for(lambda: bool(view.held))
        reset_at = trio.current_time()
        assert set(view.held) == {1, 2, 3}
        deadline = view.held_until()
        assert deadline == pytest.approx(reset_at + 15.0, abs=0.01)

        await trio.sleep(3)
        registry.fail(True)
        await trio.sleep(3)
        registry.fail(False)
        await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))
        listed = view.version
        await wait_for(lambda: view.version > listed and view.revision >= 2)
        assert set(view.members) == {1, 2, 3}
        assert set(view.held) == {2, 3}
        assert view.held_until() == deadline, "a later list does not extend the grace"
        await trio.sleep(deadline + 0.5 - trio.current_time())
        assert set(view.members) == {1}
        nursery.cancel_scope.cancel()


class CountingWatches(MemoryRegistry):
    """Records the start revision of every watch."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[int] = []

    def watch(self, prefix, start_revision):
        self.starts.append(start_revision)
        return super().watch(prefix, start_revision)


async def test_periodic_watch_restart_resumes_without_a_list(autojump_clock):
    # A list is O(N) for etcd and for every daemon; the periodic restart only bounds
    # how long a silently dead stream goes unnoticed, and resuming replays everything.
    registry = CountingWatches()
    await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(sync_members, resync_interval=10.0), registry, SPEC, view,
                            RegistryHealth())  # fmt: skip
        with trio.fail_after(5):
            while 1 not in view.members:
                await trio.sleep(0.01)
        for rank in (2, 3):  # one write in each watch period
            await trio.sleep(10.0)
            await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
        await trio.sleep(25.0)
        await registry.delete(member_key(SPEC, 2))
        with trio.fail_after(5):
            while set(view.members) != {1, 3}:
                await trio.sleep(0.01)
        assert view.lists == 1, "a periodic restart listed the members again"
        assert len(registry.starts) >= 5, registry.starts
        # Each restart resumes right after the last revision the view had seen.
        assert registry.starts == sorted(registry.starts)
        assert registry.starts[-1] <= view.revision
        nursery.cancel_scope.cancel()


async def test_a_large_mesh_restarts_its_watch_less_often(autojump_clock):
    # Every member restarts its watch: at a fixed 60 s, 1024 members cost etcd 17
    # watch requests a second at rest; spaced by the size, WATCH_RESTARTS at most.
    spec = parse_spec({"mesh": {"name": "m", "size": 1024, "network": "10.250.0.0/16"}})
    registry = CountingWatches()
    for rank in range(1024):
        await create_leased(registry, member_key(spec, rank), encode_member(wide_member(rank)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(sync_members, resync_interval=10.0), registry, spec, view,
                            RegistryHealth())  # fmt: skip
        with trio.fail_after(5):
            while len(view.members) < 1024:
                await trio.sleep(0.01)
        await trio.sleep(1024 / WATCH_RESTARTS * 3)
        # One watch, then one restart per 256 s jittered down by at most a quarter
        # (at the 10 s floor it would be 76).
        assert 4 <= len(registry.starts) <= 5, registry.starts
        assert view.lists == 1
        nursery.cancel_scope.cancel()


def wide_member(rank: int) -> Member:
    return Member(
        rank,
        base64.b64encode(rank.to_bytes(2, "big") * 16).decode(),
        f"198.18.{rank // 256}.{rank % 256}:51820",
        f"pod{rank}",
    )


class MovedOnce(CountingWatches):
    """A first watch that ends with WatchMoved (etcd's, once the relays answer again)."""

    def watch(self, prefix, start_revision):
        registry = self
        opened = super().watch(prefix, start_revision)
        if len(self.starts) > 1:
            return opened

        class Moving:
            async def __aenter__(self):
                self.inner = await opened.__aenter__()
                return self

            async def __aexit__(self, *exc):
                return await opened.__aexit__(*exc)

            def __aiter__(self):
                return self

            async def __anext__(self):
                await trio.sleep(1.0)
                raise WatchMoved(f"moved ({registry})")

        return Moving()


async def test_a_moved_watch_goes_on_from_the_next_revision_without_a_list(autojump_clock):
    registry = MovedOnce()
    await create_leased(registry, member_key(SPEC, 1), encode_member(member(1)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        with trio.fail_after(5):
            while len(registry.starts) < 2:
                await trio.sleep(0.01)
        await create_leased(registry, member_key(SPEC, 2), encode_member(member(2)))
        with trio.fail_after(5):
            while set(view.members) != {1, 2}:
                await trio.sleep(0.01)
        assert view.lists == 1, "the moved watch listed the members again"
        assert registry.starts[1] == registry.starts[0]  # resumed after the same revision
        nursery.cancel_scope.cancel()
