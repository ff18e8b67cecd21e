"""sync_members heals on its own: compaction and outages lead to a fresh list."""

from __future__ import annotations

import base64
import logging

import pytest
import trio
import trio.testing

from vnetd.errors import WatchCompacted
from vnetd.membership import encode_member, member_key
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.retry import RegistryHealth
from vnetd.spec import parse_spec
from vnetd.watcher import MemberView, sync_members

SPEC = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}})


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


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
    await registry.create(member_key(SPEC, 1), encode_member(member(1)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await registry.create(member_key(SPEC, 2), encode_member(member(2)))
        with trio.fail_after(5):
            while set(view.members) != {1, 2}:
                await trio.sleep(0.01)
        assert registry.watches == 2
        assert "listing members again" in caplog.text
        nursery.cancel_scope.cancel()


async def test_outage_keeps_view_then_relists(autojump_clock):
    registry = MemoryRegistry()
    await registry.create(member_key(SPEC, 1), encode_member(member(1)))
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
        await registry.create(member_key(SPEC, 3), encode_member(member(3)))
        with trio.fail_after(10):
            while set(view.members) != {1, 3}:
                await trio.sleep(0.05)
        assert health.reachable is True
        nursery.cancel_scope.cancel()


async def test_deleting_a_junk_key_does_not_drop_a_member():
    registry = MemoryRegistry()
    view = MemberView()
    await registry.create(member_key(SPEC, 2), encode_member(member(2)))
    kvs, revision = await registry.list_prefix("/vnetd/m/members/")
    view.replace(SPEC, kvs)
    junk = member_key(SPEC, 2).replace("/2", "/02")
    await registry.create(junk, b"{}")
    await registry.delete(junk)
    async with registry.watch("/vnetd/m/members/", revision + 1) as events:
        async for event in events:
            view.apply(SPEC, event)
            if event.kind == "delete":
                break
    assert set(view.members) == {2}
