from __future__ import annotations

import pytest
from shared import byte_key as key

from vnetd.mesh.peers import desired_peers, diff, written_after
from vnetd.model import DevicePeer, Member, Peer, PeerUpdate
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 8, "network": "10.250.0.0/16"}})


def member(rank: int, k: int | None = None, endpoint: str | None = None) -> Member:
    return Member(
        rank, key(rank if k is None else k), endpoint or f"198.18.1.{rank + 1}:51820", f"pod{rank}"
    )


def peer(rank: int, k: int | None = None, endpoint: str | None = None) -> Peer:
    return Peer(
        key(rank if k is None else k),
        (f"10.250.0.{rank + 1}/32",),
        endpoint or f"198.18.1.{rank + 1}:51820",
        rank,
    )


def test_desired_peers_derive_addresses_from_rank_not_registry():
    members = {r: member(r) for r in range(4)}
    peers, skipped = desired_peers(members, 0, SPEC)
    assert sorted(p.rank for p in peers.values()) == [1, 2, 3]
    assert peers[key(2)].allowed_ips == ("10.250.0.3/32",)
    assert skipped == []


def test_duplicate_public_key_keeps_lowest_rank_only():
    members = {1: member(1, k=9), 2: member(2, k=9), 3: member(3)}
    peers, skipped = desired_peers(members, 0, SPEC)
    assert peers[key(9)].rank == 1
    assert [s.rank for s in skipped] == [2]
    all_ips = [ip for p in peers.values() for ip in p.allowed_ips]
    assert len(all_ips) == len(set(all_ips)), "an overlay address is on two peers"


def test_own_key_under_another_rank_is_ignored():
    members = {0: member(0), 5: member(5, k=0)}
    peers, skipped = desired_peers(members, 0, SPEC, self_key=key(0))
    assert peers == {}
    assert [s.rank for s in skipped] == [5]


def device(p: Peer, endpoint: str | None = None) -> DevicePeer:
    return DevicePeer(p.public_key, p.allowed_ips, endpoint if endpoint is not None else p.endpoint)


@pytest.mark.parametrize(
    ("desired", "actual", "written", "expect"),
    [
        pytest.param([], [], {}, ((), (), ()), id="empty"),
        pytest.param([peer(1)], [], {}, ((), (), (peer(1),)), id="join-adds-one"),
        pytest.param(
            [peer(1), peer(2)],
            [peer(1)],
            {key(1): peer(1).endpoint},
            ((), (), (peer(2),)),
            id="second-join-touches-only-it",
        ),
        pytest.param(
            [peer(1)], [peer(1), peer(2)], {}, ((peer(2),), (), ()), id="leave-removes-one"
        ),
        pytest.param([peer(1)], [peer(1)], {key(1): peer(1).endpoint}, ((), (), ()), id="steady"),
    ],
)
def test_diff_is_incremental(desired, actual, written, expect):
    plan = diff(
        {p.public_key: p for p in desired}, {p.public_key: device(p) for p in actual}, written
    )
    removed = tuple(p.public_key for p in plan.remove)
    assert removed == tuple(p.public_key for p in expect[0])
    assert plan.update == expect[1]
    assert plan.add == expect[2]


def test_roamed_endpoint_is_not_corrected_back():
    # The device learned 203.0.113.7:4000 from authenticated packets (NAT);
    # the registry still says what it said before: leave the device alone.
    want = peer(1)
    actual = {want.public_key: device(want, endpoint="198.19.0.7:4000")}
    plan = diff({want.public_key: want}, actual, {want.public_key: want.endpoint})
    assert not plan


def test_registry_endpoint_change_is_written():
    old, new = peer(1), peer(1, endpoint="198.18.9.9:51820")
    actual = {old.public_key: device(old, endpoint="198.19.0.7:4000")}
    plan = diff({new.public_key: new}, actual, {old.public_key: old.endpoint})
    assert plan.update == (PeerUpdate(new.public_key, "198.18.9.9:51820", None, old.allowed_ips),)
    assert not plan.add and not plan.remove


def test_unknown_written_endpoint_compares_with_device():
    want = peer(1)
    actual = {want.public_key: device(want, endpoint="198.18.5.5:1")}
    plan = diff({want.public_key: want}, actual, {})
    assert plan.update[0].endpoint == want.endpoint


def test_key_change_removes_old_and_adds_new_in_one_plan():
    old, new = peer(1, k=1), peer(1, k=42)
    plan = diff({new.public_key: new}, {old.public_key: device(old)}, {})
    assert [p.public_key for p in plan.remove] == [old.public_key]
    assert plan.add == (new,)


def test_wrong_allowed_ips_on_device_are_fixed():
    want = peer(1)
    actual = {want.public_key: DevicePeer(want.public_key, ("10.250.0.99/32",), want.endpoint)}
    plan = diff({want.public_key: want}, actual, {want.public_key: want.endpoint})
    assert plan.update == (
        PeerUpdate(want.public_key, None, want.allowed_ips, ("10.250.0.99/32",)),
    )


def test_written_after_records_registry_endpoints():
    p = peer(3)
    assert written_after({p.public_key: p}) == {p.public_key: p.endpoint}
