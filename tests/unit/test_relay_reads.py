"""A daemon's reads with relays (``registry.relay.reads``): the members through a relay,
all else to etcd, and a relay that breaks mid-watch resumed on etcd with no gap."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from vnetd.errors import RegistryUnavailable, WatchMoved
from vnetd.registry.base import WatchEvent
from vnetd.registry.memory import MemoryRegistry
from vnetd.registry.relay.reads import FIRST_REST, RELAYS_REST, RelayedRegistry

P = "/vnetd/m/members/"


async def both(etcd: MemoryRegistry, relay: MemoryRegistry, key: str, value: bytes) -> None:
    """The same write on both (same revisions): the relay's copy stands for a relay."""
    await etcd.create(key, value)
    await relay.create(key, value)


def relayed(etcd: MemoryRegistry, relay: MemoryRegistry) -> RelayedRegistry:
    return RelayedRegistry(etcd, relay, lambda prefix: prefix == P)


async def test_members_are_read_through_the_relay_and_writes_go_to_etcd(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    await relay.create(f"{P}9", b"only-the-relay-has-it")
    registry = relayed(etcd, relay)
    kvs, _ = await registry.list_prefix(P)
    assert [kv.key for kv in kvs] == [f"{P}9"]
    await registry.create(f"{P}1", b"mine")
    assert await etcd.get(f"{P}1") is not None
    assert await relay.get(f"{P}1") is None
    others, _ = await registry.list_prefix("/vnetd/m/assign-rank/")
    assert others == []


async def test_a_relay_that_breaks_mid_watch_is_resumed_on_etcd_without_a_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    registry = relayed(etcd, relay)
    _, revision = await registry.list_prefix(P)
    seen: list[WatchEvent] = []
    with trio.fail_after(30):
        async with registry.watch(P, revision + 1) as batches:
            await both(etcd, relay, f"{P}1", b"a")
            seen += await batches.__anext__()
            relay.fail(True)  # the relay dies; etcd goes on
            await etcd.create(f"{P}2", b"b")
            await etcd.create(f"{P}3", b"c")
            while len(seen) < 3:
                seen += await batches.__anext__()
    assert [(e.key, e.value) for e in seen] == [(f"{P}1", b"a"), (f"{P}2", b"b"), (f"{P}3", b"c")]
    revisions = [e.mod_revision for e in seen]
    assert revisions == sorted(set(revisions))


async def test_without_a_relay_the_reads_go_to_etcd_and_the_relays_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    relay.fail(True)
    await etcd.create(f"{P}1", b"a")
    registry = relayed(etcd, relay)
    kvs, _ = await registry.list_prefix(P)
    assert [kv.key for kv in kvs] == [f"{P}1"]
    relay.fail(False)
    await relay.create(f"{P}7", b"relay")
    kvs, _ = await registry.list_prefix(P)  # resting: etcd still
    assert [kv.key for kv in kvs] == [f"{P}1"]
    await trio.sleep(RELAYS_REST)
    kvs, _ = await registry.list_prefix(P)
    assert [kv.key for kv in kvs] == [f"{P}7"]


async def test_with_neither_the_read_fails_as_etcd_s_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    etcd.fail(True)
    relay.fail(True)
    registry = relayed(etcd, relay)
    with pytest.raises(RegistryUnavailable):
        await registry.list_prefix(P)


async def test_a_relay_behind_what_was_read_is_left_for_etcd_and_only_etcd_going_back_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A relay's revision is its last member event: after reading etcd directly, a relay
    whose list is older is not taken (it would read as a reset store); etcd's own list
    going back is taken, and relays serve again from there."""
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    for n in range(4):
        await etcd.create(f"/vnetd/m/assign-rank/{n}", b"other keys move etcd's revision")
    await both(etcd, relay, f"{P}1", b"a")
    registry = relayed(etcd, relay)
    relay.fail(True)
    _, direct = await registry.list_prefix(P)  # the relay is down: etcd's revision (6)
    relay.fail(False)
    await trio.sleep(RELAYS_REST)
    behind = (await relay.list_prefix(P))[1]
    kvs, revision = await registry.list_prefix(P)
    assert revision == direct > behind  # etcd's, not the relay's
    assert [kv.key for kv in kvs] == [f"{P}1"]
    reset = MemoryRegistry()  # etcd restored from an old snapshot: the revision goes back
    await reset.create(f"{P}1", b"a")
    registry.direct = reset
    _, revision = await registry.list_prefix(P)  # the relay's is behind 6 still: etcd's
    assert revision == (await reset.list_prefix(P))[1] < direct
    await relay.create(f"{P}2", b"b")  # the relay, re-listed from the restored store
    kvs, revision = await registry.list_prefix(P)
    assert revision == (await relay.list_prefix(P))[1]  # the relay serves again
    assert sorted(kv.key for kv in kvs) == [f"{P}1", f"{P}2"]


async def test_events_read_through_a_watch_count_as_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    registry = relayed(etcd, relay)
    relay.fail(True)
    _, revision = await registry.list_prefix(P)
    with trio.fail_after(30):
        async with registry.watch(P, revision + 1) as batches:  # on etcd: the relays rest
            for n in range(3):
                await etcd.create(f"{P}{n}", b"x")
            seen = 0
            while seen < 3:
                seen += len(await batches.__anext__())
    relay.fail(False)
    await both(etcd, relay, f"{P}7", b"late")  # the relay's revision 1, etcd's 4
    await trio.sleep(RELAYS_REST)
    _, revision = await registry.list_prefix(P)
    assert revision == (await etcd.list_prefix(P))[1] > (await relay.list_prefix(P))[1]


async def test_relays_that_start_after_the_daemon_take_its_watch_over_without_a_list(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Relays rendered with the mesh start beside its daemons: a daemon whose relays do
    not answer yet reads etcd at once (no gap), and once their first rest (FIRST_REST s)
    ends its member watch on etcd ends with WatchMoved, to go on through the relays."""
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    await both(etcd, relay, f"{P}1", b"a")
    registry = relayed(etcd, relay)
    relay.fail(True)
    start = trio.current_time()
    kvs, revision = await registry.list_prefix(P)
    assert [kv.key for kv in kvs] == [f"{P}1"] and trio.current_time() == start  # no wait
    relay.fail(False)
    with trio.fail_after(FIRST_REST + 1):
        async with registry.watch(P, revision + 1) as batches:  # on etcd: the relays rest
            with pytest.raises(WatchMoved):
                await batches.__anext__()
    assert FIRST_REST <= trio.current_time() - start < FIRST_REST + 1
    async with registry.watch(P, revision + 1) as batches:  # the relay's now
        await relay.create(f"{P}9", b"only-the-relay-has-it")
        with trio.fail_after(1):
            assert [e.key for e in await batches.__anext__()] == [f"{P}9"]


async def test_a_watch_of_another_prefix_never_moves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, relay = MemoryRegistry(), MemoryRegistry()
    registry = relayed(etcd, relay)
    other = "/vnetd/m/assign-rank/"

    async def later() -> None:
        await trio.sleep(RELAYS_REST * 2)
        await etcd.create(f"{other}0", b"x")

    async with registry.watch(other, 1) as batches, trio.open_nursery() as nursery:
        nursery.start_soon(later)
        with trio.fail_after(RELAYS_REST * 3):
            assert [e.key for e in await batches.__anext__()] == [f"{other}0"]
