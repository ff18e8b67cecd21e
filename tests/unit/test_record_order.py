"""Within one credential, issue 44's holes 1 and 2: a leaseless entry is no member, and a
holder's records carry an order readers enforce (docs/architecture.md, "Registry
layout"; docs/security.md, "Within one credential").

The e2e twins, against real etcd and wireguard-go, are in tests/e2e/test_rank_holder.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import pytest
import trio
import trio.testing
from shared import byte_key as key

from vnetd.control.claim import ClaimHolder
from vnetd.control.claim_attempt import Claimed, try_claim
from vnetd.control.holders import KEYS_ORDERED, RecordOrder
from vnetd.control.membership import SEQ_MAX, decode_member, encode_member, member_key
from vnetd.control.proof import Signer
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec(
    {"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}, "registry": {"lease_ttl": 6}}
)
KEY1 = member_key(SPEC, 1)
HOLDER_SIGNER = Signer.generate()
MOVED_SIGNER = Signer.generate()
INTRUDER_SIGNER = Signer.generate()
HOLDER = Member(1, key(1), "198.18.1.1:51820", "pod1", 100.0, "1.0",
                signing_key=HOLDER_SIGNER.public_key)  # fmt: skip
INTRUDER = Member(1, key(9), "198.18.9.9:51820", "intruder", 1.0, "x",
                  signing_key=INTRUDER_SIGNER.public_key)  # fmt: skip


def record(member: Member, signer: Signer | None, lease: int, seq: int = 0) -> bytes:
    if signer is None:
        return encode_member(replace(member, signing_key="", seq=seq))
    return encode_member(
        replace(member, signing_key=signer.public_key, seq=seq), signer, key=KEY1, lease=lease
    )


# --- hole 1: a leaseless entry is no member ---------------------------------------------------

LEASELESS = [
    pytest.param(lambda: record(INTRUDER, INTRUDER_SIGNER, 0), id="signed-by-the-intruder"),
    pytest.param(lambda: record(HOLDER, HOLDER_SIGNER, 0, seq=5), id="signed-by-the-holder"),
    pytest.param(lambda: record(INTRUDER, None, 0), id="unsigned"),
]


@pytest.mark.parametrize("value", LEASELESS)
def test_a_leaseless_entry_is_no_member_whatever_its_signature(
    value: Callable[[], bytes],
) -> None:
    listed = MemberView()
    listed.replace(SPEC, [KeyValue(KEY1, value(), 5, 5, 0)], 5)
    watched = MemberView()
    watched.replace(SPEC, [], 4)
    watched.apply(SPEC, WatchEvent("put", KEY1, value(), 5, 5, 0))
    for view in (listed, watched):
        assert view.members == {} and view.bad_total == 1
        assert view.bad_entries[KEY1].startswith(f"{KEY1}: no lease: ")


@pytest.mark.parametrize("value", LEASELESS)
def test_a_held_entry_rewritten_leaseless_in_place_keeps_its_holder(
    value: Callable[[], bytes],
) -> None:
    """An etcd put without a lease on a live entry detaches it from the holder's lease."""
    view = MemberView()
    view.replace(SPEC, [KeyValue(KEY1, record(HOLDER, HOLDER_SIGNER, 7, seq=10), 5, 5, 7)], 5)
    view.apply(SPEC, WatchEvent("put", KEY1, value(), 6, 5, 0))
    assert view.members[1].public_key == HOLDER.public_key and view.leases == {1: 7}
    assert view.overwritten == {1: 6}  # the holder writes its record back


async def test_read_members_skips_a_leaseless_entry() -> None:
    from vnetd.control.membership import read_members

    registry = MemoryRegistry()
    await registry.create(KEY1, record(INTRUDER, INTRUDER_SIGNER, 0))
    assert await read_members(registry, SPEC) == ({}, 1)


# --- hole 2: the order of a holder's records ---------------------------------------------------


@pytest.mark.parametrize(
    ("writes", "accepted"),
    [
        pytest.param([(10, 5), (11, 6)], [True, True], id="later"),
        pytest.param([(10, 5), (9, 6)], [True, False], id="older"),
        pytest.param([(10, 5), (10, 6)], [True, False], id="equal-as-a-new-write"),
        pytest.param([(10, 5), (10, 5)], [True, True], id="the-same-write-again"),
        pytest.param([(0, 5), (0, 6)], [True, True], id="older-versions-not-ordered"),
        pytest.param([(10, 5), (0, 6)], [True, False], id="no-seq-after-a-seq"),
        pytest.param([(0, 5), (3, 6)], [True, True], id="a-seq-after-none"),
    ],
)  # fmt: skip
def test_record_order(writes: list[tuple[int, int]], accepted: list[bool]) -> None:
    order = RecordOrder()
    results = []
    for seq, revision in writes:
        member = replace(HOLDER, seq=seq)
        ok = order.refusal(member, revision) is None
        if ok:
            order.accept(member, revision)
        results.append(ok)
    assert results == accepted


def test_record_order_keeps_the_last_keys_of_each_rank() -> None:
    order = RecordOrder()
    signers = [Signer.generate() for _ in range(KEYS_ORDERED + 1)]
    for n, signer in enumerate(signers):
        order.accept(replace(HOLDER, signing_key=signer.public_key, seq=100), n)
    first, last = (
        replace(HOLDER, signing_key=s.public_key, seq=50) for s in (signers[0], signers[-1])
    )
    assert order.refusal(first, 99) is None  # forgotten: the oldest of five
    assert order.refusal(last, 99) == 100
    assert len(order) == KEYS_ORDERED
    assert order.refusal(replace(INTRUDER, seq=1), 99) is None  # unsigned rank keys: no order
    assert order.refusal(replace(HOLDER, signing_key="", seq=1), 99) is None


def holding(seq: int = 20) -> MemberView:
    view = MemberView()
    view.replace(SPEC, [KeyValue(KEY1, record(HOLDER, HOLDER_SIGNER, 7, seq), 5, 5, 7)], 5)
    return view


def test_an_older_record_put_back_in_place_is_refused_and_counted(caplog) -> None:
    view = holding()
    old = replace(HOLDER, endpoint="198.18.1.9:51820")
    for mod in (6, 7):  # every replay is counted
        view.apply(SPEC, WatchEvent("put", KEY1, record(old, HOLDER_SIGNER, 7, 19), mod, 5, 7))
    assert view.members[1].endpoint == HOLDER.endpoint
    assert view.refused_total == 2 and view.overwritten == {1: 7}
    assert "its seq 19 is not after 20" in caplog.text
    newer = replace(HOLDER, endpoint="198.18.1.5:51820")
    view.apply(SPEC, WatchEvent("put", KEY1, record(newer, HOLDER_SIGNER, 7, 21), 8, 5, 7))
    assert view.members[1].endpoint == newer.endpoint


def test_an_older_record_in_a_new_entry_is_no_member() -> None:
    """Deleted and created again (any lease, e.g. the old lease id granted again)."""
    view = holding()
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 6))
    view.apply(SPEC, WatchEvent("put", KEY1, record(HOLDER, HOLDER_SIGNER, 3, 19), 7, 7, 3))
    assert view.members == {} and view.refused_total == 1


def test_a_record_from_before_a_move_is_refused_under_its_old_lease() -> None:
    """Rank 1 moved (a new pod, a new signing key); its old record, under its old lease id
    granted again, is put back after a delete: the reader still knows the old key's order."""
    old = record(HOLDER, HOLDER_SIGNER, 7, 20)
    view = MemberView()
    view.replace(SPEC, [KeyValue(KEY1, old, 5, 5, 7)], 5)
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 6))
    moved = replace(HOLDER, public_key=key(2), endpoint="198.18.2.1:51820")
    view.apply(SPEC, WatchEvent("put", KEY1, record(moved, MOVED_SIGNER, 8, 30), 7, 7, 8))
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 8))
    view.apply(SPEC, WatchEvent("put", KEY1, old, 9, 9, 7))
    assert view.members == {} and view.refused_total == 1
    relisted = MemberView()  # a reader that never saw the old record takes it: the limit
    relisted.replace(SPEC, [KeyValue(KEY1, old, 9, 9, 7)], 9)
    assert 1 in relisted.members


def test_a_relist_takes_the_write_it_accepted_again() -> None:
    view = holding()
    view.replace(SPEC, [KeyValue(KEY1, record(HOLDER, HOLDER_SIGNER, 7, 20), 5, 5, 7)], 9)
    assert 1 in view.members and view.refused_total == 0


# --- the holder: seq written, told when its entry is not its own ------------------------------


async def test_each_record_is_after_the_last_and_after_the_entry_it_replaces() -> None:
    registry = MemoryRegistry()
    lease = await registry.grant(60)
    first = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER)
    assert isinstance(first, Claimed) and first.seq > 0
    again = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER, after=first.seq)
    assert isinstance(again, Claimed) and again.seq > first.seq
    future = again.seq + 10**15  # written by a clock ahead of ours (a restart elsewhere)
    entry = await registry.get(KEY1)
    assert entry is not None
    await registry.replace(KEY1, record(HOLDER, HOLDER_SIGNER, lease, future), entry.mod_revision,
                           lease)  # fmt: skip
    restarted = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER)
    assert isinstance(restarted, Claimed) and restarted.seq == future + 1
    stored = await registry.get(KEY1)
    assert stored is not None
    assert decode_member(SPEC, KEY1, stored.value, lease).seq == future + 1


async def test_another_keys_seq_is_not_passed_when_its_entry_is_taken_over() -> None:
    """Readers order one signing key's records: a leaseless entry signed by another key,
    at the highest seq there is, must not push our next record past what readers take."""
    registry = MemoryRegistry()
    lease = await registry.grant(60)
    await registry.create(KEY1, record(INTRUDER, INTRUDER_SIGNER, 0, SEQ_MAX), 0)
    result = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER)
    assert isinstance(result, Claimed) and result.took_over
    assert 0 < result.seq < SEQ_MAX
    stored = await registry.get(KEY1)
    assert stored is not None
    assert decode_member(SPEC, KEY1, stored.value, lease).seq == result.seq


async def test_an_older_record_of_ours_put_back_is_named() -> None:
    registry = MemoryRegistry()
    lease = await registry.grant(60)
    await registry.create(KEY1, record(HOLDER, HOLDER_SIGNER, lease, 5), lease)
    result = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER, after=9)
    assert isinstance(result, Claimed) and result.seq > 9
    assert result.replaced == (
        f"an older record of ours put back (instance pod1, signing key "
        f"{HOLDER_SIGNER.public_key[:12]}, lease {lease:x}, seq 5 before 9)"
    )


async def holder_running(
    registry: MemoryRegistry, nursery: trio.Nursery
) -> tuple[ClaimHolder, MemberView]:
    view = MemberView()
    health = RegistryHealth()
    claim = ClaimHolder(registry, SPEC, replace(HOLDER, signing_key=""), health, view,
                        HOLDER_SIGNER)  # fmt: skip
    await nursery.start(sync_members, registry, SPEC, view, health)
    await nursery.start(claim.run)
    await claim.claimed.wait()
    await trio.sleep(1)
    return claim, view


async def test_the_holder_takes_back_a_leaseless_recreation_and_says_what_it_found(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry = MemoryRegistry()
    async with trio.open_nursery() as nursery:
        claim, view = await holder_running(registry, nursery)
        await registry.delete(KEY1)
        await registry.create(KEY1, record(INTRUDER, INTRUDER_SIGNER, 0))
        await trio.sleep(2)
        entry = await registry.get(KEY1)
        assert entry is not None and entry.lease == claim.lease
        assert view.members[1].public_key == HOLDER.public_key
        assert claim.state == "claimed" and claim.displaced == 0
        nursery.cancel_scope.cancel()
    line = (f"claimed rank 1 as pod1 (took over a leaseless entry (instance intruder, signing "
            f"key {INTRUDER_SIGNER.public_key[:12]}, no lease), lease ")  # fmt: skip
    assert line in caplog.text


async def test_the_holder_writes_back_an_older_record_of_its_own_and_says_so(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    registry = MemoryRegistry()
    async with trio.open_nursery() as nursery:
        claim, view = await holder_running(registry, nursery)
        entry = await registry.get(KEY1)
        assert entry is not None
        claim.set_device_id("d2")  # a newer record
        await trio.sleep(1)
        assert view.members[1].device_id == "d2"
        newer = await registry.get(KEY1)
        assert newer is not None
        await registry.replace(KEY1, entry.value, newer.mod_revision, entry.lease)  # a replay
        await trio.sleep(SPEC.registry.lease_ttl / 3 + 1)  # written back at the next keepalive
        current = await registry.get(KEY1)
        assert current is not None and current.mod_revision > newer.mod_revision + 1
        assert decode_member(SPEC, KEY1, current.value, current.lease).device_id == "d2"
        assert view.members[1].device_id == "d2" and view.refused_total == 1
        assert claim.restores == 1
        nursery.cancel_scope.cancel()
    assert "rank 1's entry: found an older record of ours put back" in caplog.text
