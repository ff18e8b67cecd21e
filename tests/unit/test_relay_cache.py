"""The relay's state (``registry.relay.cache``): the members, the window of recent
events, the floor below which a watch is answered "compacted", and paged lists."""

from __future__ import annotations

import pytest

from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.relay.cache import MemberCache
from vnetd.registry.relay.reads import members_prefixes

P = "/vnetd/m/members/"


def put(rank: int, revision: int, value: bytes = b"r", lease: int = 7) -> WatchEvent:
    return WatchEvent("put", f"{P}{rank}", value, revision, revision, lease)


def delete(rank: int, revision: int) -> WatchEvent:
    return WatchEvent("delete", f"{P}{rank}", b"", revision)


def listed(*ranks: int, revision: int = 10) -> MemberCache:
    cache = MemberCache(P, window_events=4)
    cache.replace([KeyValue(f"{P}{r}", b"v", r, r, 7) for r in ranks], revision)
    return cache


def test_a_list_is_the_snapshot_and_a_watch_from_after_it_is_served() -> None:
    cache = listed(1, 2)
    assert cache.synced
    assert (cache.revision, cache.floor) == (10, 10)
    assert cache.events_since(11) == []
    assert cache.events_since(10) is None  # before the list: compacted, list again


def test_a_batch_updates_the_members_and_the_window() -> None:
    cache = listed(1, 2)
    batch = [put(3, 11), delete(1, 12), put(2, 13, b"moved")]
    assert cache.apply(batch) == 3
    assert sorted(cache.members) == [f"{P}2", f"{P}3"]
    assert cache.members[f"{P}2"].value == b"moved"
    assert cache.revision == 13
    assert cache.events_since(12) == batch[1:]
    assert cache.events_since(14) == []


def test_events_of_one_revision_are_all_kept() -> None:
    """A lease's end deletes all its keys in one revision: none of them is a repeat."""
    cache = listed(1, 2)
    assert cache.apply([delete(1, 11), delete(2, 11)]) == 2
    assert cache.members == {}
    assert [e.key for e in cache.events_since(11) or []] == [f"{P}1", f"{P}2"]


def test_events_the_list_held_are_skipped() -> None:
    cache = listed(1, revision=10)
    assert cache.apply([put(1, 10), put(2, 11)]) == 1
    assert [e.mod_revision for e in cache.window] == [11]


def test_the_window_keeps_the_last_events_and_its_floor_rises() -> None:
    cache = listed(revision=10)
    cache.apply([put(r, 10 + r) for r in range(1, 7)])  # revisions 11..16, 4 kept
    assert [e.mod_revision for e in cache.window] == [13, 14, 15, 16]
    assert cache.floor == 12
    assert cache.events_since(12) is None  # its event left the window
    assert [e.mod_revision for e in cache.events_since(13) or []] == [13, 14, 15, 16]
    assert len(cache.members) == 6  # the members are whole whatever the window keeps


def test_a_new_list_is_a_new_epoch_and_empties_the_window() -> None:
    """A relay behind by a compaction lists again: the events between are unknown."""
    cache = listed(1)
    cache.apply([put(2, 11)])
    epoch = cache.epoch
    cache.replace([KeyValue(f"{P}5", b"v", 40, 40)], 50)
    assert cache.epoch == epoch + 1
    assert cache.window == []
    assert cache.events_since(12) is None
    assert cache.events_since(51) == []
    assert list(cache.members) == [f"{P}5"]


def test_a_lost_watch_serves_nothing_until_the_next_list() -> None:
    cache = listed(1)
    cache.lost()
    assert not cache.synced
    cache.replace([], 12)
    assert cache.synced


def test_pages_are_one_snapshot_while_members_change() -> None:
    cache = listed(1, 2, 3, revision=10)
    first = cache.page(P, P[:-1] + "0", 2, 0)
    assert first is not None
    assert ([kv.key for kv in first.kvs], first.more, first.count) == ([f"{P}1", f"{P}2"], True, 3)
    cache.apply([delete(3, 11), put(4, 12)])
    rest = cache.page(f"{P}2\0", P[:-1] + "0", 2, first.revision)
    assert rest is not None
    assert ([kv.key for kv in rest.kvs], rest.more, rest.revision) == ([f"{P}3"], False, 10)
    now = cache.page(P, P[:-1] + "0", 0, 0)
    assert now is not None
    assert ([kv.key for kv in now.kvs], now.revision) == ([f"{P}1", f"{P}2", f"{P}4"], 12)


def test_a_revision_no_longer_kept_is_refused() -> None:
    cache = listed(1, revision=10)
    cache.apply([put(2, 11)])
    assert cache.page(P, P[:-1] + "0", 0, 10) is None  # never read at: the list starts over
    assert cache.page(f"{P}1", "", 0, 0) is not None
    single = cache.page(f"{P}1", "", 0, 0)
    assert single is not None
    assert [kv.key for kv in single.kvs] == [f"{P}1"]


@pytest.mark.parametrize(
    ("prefix", "relayed"),
    [
        pytest.param("/vnetd/m/members/", True, id="a-mesh-s-members"),
        pytest.param("/vnetd/m/assign-rank/", False, id="assignments"),
        pytest.param("/vnetd/m/spec", False, id="spec"),
        pytest.param("/other/m/members/", False, id="another-registry-prefix"),
        pytest.param("/vnetd/a/b/members/", False, id="nested"),
    ],
)
def test_only_the_members_are_read_through_relays(prefix: str, relayed: bool) -> None:
    assert members_prefixes("/vnetd")(prefix) is relayed
