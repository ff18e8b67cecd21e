"""A pass costs O(change) (invariant 11) and still keeps invariants 1, 2 and 4.

A pass after a change diffs only the peers of the changed ranks against what
the reconciler applied, without reading the device; a full pass (the first,
every ``resync_interval``, after a failure, on request, after a list) reads
it once. Whatever the changes, the device ends where a full computation says.
FakeDataplane, MemberView fed as the member watch feeds it; virtual time.
"""

from __future__ import annotations

import base64
from ipaddress import ip_interface, ip_network

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared import wide_key as key

from vnetd.control.membership import encode_member, member_key
from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import FULL_PASS_PEERS, Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import DataplaneError
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member, Plan
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.spec import parse_spec

SIZE = 1024
SPEC = parse_spec({"mesh": {"name": "m", "size": SIZE, "network": "10.64.0.0/16"}})
SELF = 0
CONFIG = DeviceConfig(
    "vnet0", base64.b64encode(b"\xff" * 32).decode(), 51820,
    ip_interface("10.64.0.1/16"), ip_network("10.64.0.0/16"), 1420,
)  # fmt: skip


def member(rank: int, key_of: int | None = None, port: int = 51820) -> Member:
    """Rank ``rank``'s entry, carrying ``key_of``'s public key (its own by default)."""
    owner = rank if key_of is None else key_of
    return Member(rank, key(owner), f"198.18.{rank // 250}.{rank % 250 + 1}:{port}", f"pod{rank}")


def address(rank: int) -> tuple[str, ...]:
    return SPEC.allowed_ips(rank)


class Registry:
    """Revisions for the view's events, as etcd numbers them."""

    def __init__(self, view: MemberView) -> None:
        self.view = view
        self.revision = 1
        self.created: dict[int, int] = {}

    def listed(self, members: list[Member]) -> None:
        kvs = []
        for m in members:
            self.revision += 1
            self.created[m.rank] = self.revision
            kvs.append(
                KeyValue(
                    member_key(SPEC, m.rank), encode_member(m), self.revision, self.revision, 1
                )
            )
        self.view.replace(SPEC, kvs, self.revision)

    def batch(self, *changes: Member | int) -> None:
        """Puts (a ``Member``) and deletes (a rank) delivered as one watch batch."""
        events = []
        for change in changes:
            self.revision += 1
            if isinstance(change, int):
                self.created.pop(change, None)
                events.append(WatchEvent("delete", member_key(SPEC, change), b"", self.revision))
                continue
            created = self.created.setdefault(change.rank, self.revision)
            value = encode_member(change)
            events.append(
                WatchEvent("put", member_key(SPEC, change.rank), value, self.revision, created, 1)
            )
        self.view.apply_batch(SPEC, events)


def setup(ranks: range = range(SIZE)) -> tuple[Reconciler, FakeDataplane, Registry]:
    view, device = MemberView(), FakeDataplane(CONFIG)
    registry = Registry(view)
    registry.listed([member(r) for r in ranks])
    return Reconciler(SPEC, SELF, key(SELF), view, device), device, registry


def full_computation(reconciler: Reconciler) -> dict[str, tuple[tuple[str, ...], str | None]]:
    view = reconciler.view
    desired, _ = desired_peers(view.members, SELF, SPEC, key(SELF), view.created)
    return {k: (p.allowed_ips, p.endpoint) for k, p in desired.items()}


def on_device(device: FakeDataplane) -> dict[str, tuple[tuple[str, ...], str | None]]:
    return {k: (p.allowed_ips, p.endpoint) for k, p in device.device.items()}


async def test_a_pass_over_1024_members_with_one_change_reads_the_device_at_most_once(
    autojump_clock,
):
    reconciler, device, registry = setup()
    await reconciler.reconcile_once()
    assert len(device.device) == SIZE - 1 and device.peer_reads == 1

    registry.batch(member(7, port=51900))  # a new endpoint for rank 7
    plan = await reconciler.reconcile_once()
    assert len(plan) == 1 and plan.update[0].endpoint == "198.18.0.8:51900"
    registry.batch(5)  # rank 5 leaves
    assert [p.public_key for p in (await reconciler.reconcile_once()).remove] == [key(5)]
    registry.batch(member(5))  # and joins again
    assert [p.rank for p in (await reconciler.reconcile_once()).add] == [5]
    assert not await reconciler.reconcile_once(), "nothing changed, nothing to do"
    assert device.peer_reads == 1, "a pass after a change read the whole device"
    assert on_device(device) == full_computation(reconciler)
    assert await device.routes() == {address(r)[0] for r in range(1, SIZE)}


async def test_the_device_is_read_by_a_full_pass_only(autojump_clock):
    reconciler, device, registry = setup(range(16))
    await reconciler.reconcile_once()
    registry.batch(member(20))
    await reconciler.reconcile_once()
    assert device.peer_reads == 1
    await trio.sleep(reconciler.resync_interval)  # the periodic resync: one read
    await reconciler.reconcile_once()
    assert device.peer_reads == 2
    await reconciler.reconcile_once(resync="a test")  # asked for
    assert device.peer_reads == 3
    registry.listed([member(r) for r in range(8)])  # listed again: anything may have changed
    plan = await reconciler.reconcile_once()
    assert device.peer_reads == 4 and len(plan.remove) == 9


async def test_after_a_failed_apply_the_next_pass_reads_the_device(autojump_clock):
    class FailOnce(FakeDataplane):
        fail = True

        async def apply(self, plan: Plan) -> None:
            if self.fail:
                self.fail = False
                raise DataplaneError("UAPI: refused")
            await super().apply(plan)

    view, device = MemberView(), FailOnce(CONFIG)
    registry = Registry(view)
    registry.listed([member(r) for r in range(4)])
    reconciler = Reconciler(SPEC, SELF, key(SELF), view, device)
    with pytest.raises(DataplaneError):
        await reconciler.reconcile_once()
    await reconciler.reconcile_once()
    assert device.peer_reads == 2
    assert on_device(device) == full_computation(reconciler)


async def test_a_copy_of_a_key_in_a_changed_rank_follows_the_earliest_registration(
    autojump_clock,
):
    reconciler, device, registry = setup(range(8))  # registered: no peer waits (invariant 10)
    await reconciler.reconcile_once()
    rank3 = device.device[key(3)]

    registry.batch(member(9, key_of=3))  # a copy of rank 3's key at a free rank, later
    assert not await reconciler.reconcile_once(), "the copy took rank 3's peer"
    assert device.device[key(3)] == rank3
    assert reconciler.stats.skipped == 1

    registry.batch(3)  # rank 3's entry is deleted: the copy is now the earliest
    plan = await reconciler.reconcile_once()
    assert device.device[key(3)].allowed_ips == address(9)
    assert [u.allowed_ips for u in plan.update] == [address(9)]

    registry.batch(member(3))  # rank 3 registers again: after the copy, so it is skipped
    assert not await reconciler.reconcile_once()
    assert device.device[key(3)].allowed_ips == address(9)

    registry.batch(9)  # the copy goes: rank 3 holds its key again
    await reconciler.reconcile_once()
    assert device.device[key(3)].allowed_ips == address(3)
    assert on_device(device) == full_computation(reconciler)
    assert device.peer_reads == 1


async def test_a_rewrite_to_a_key_registered_later_takes_it_and_frees_the_old(autojump_clock):
    # Rank 1's entry (created first) is rewritten with rank 2's key: rank 1 is the
    # earliest registration of that key now, and its own old key has no member.
    reconciler, device, registry = setup(range(4))  # registered: no peer waits (invariant 10)
    await reconciler.reconcile_once()
    registry.batch(member(1, key_of=2))
    plan = await reconciler.reconcile_once()
    assert [p.public_key for p in plan.remove] == [key(1)]
    assert device.device[key(2)].allowed_ips == address(1)
    assert on_device(device) == full_computation(reconciler)
    assert len({ip for p in device.device.values() for ip in p.allowed_ips}) == len(
        [ip for p in device.device.values() for ip in p.allowed_ips]
    ), "an address on two peers"


# Whatever the batches, incremental passes leave the device where a full pass would.

RANKS = st.integers(min_value=1, max_value=11)  # not SELF: its registration is not a peer's
CHANGE = st.one_of(
    RANKS,  # a delete
    st.builds(lambda r, k, p: member(r, key_of=k, port=p), RANKS, RANKS, st.sampled_from([1, 2])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(CHANGE, min_size=1, max_size=4), min_size=1, max_size=12))
def test_incremental_passes_agree_with_a_full_computation(batches: list[list[Member | int]]):
    async def run() -> None:
        reconciler, device, registry = setup(range(6))
        await reconciler.reconcile_once()
        for batch in batches:
            registry.batch(*batch)
            await reconciler.reconcile_once()
            assert on_device(device) == full_computation(reconciler)
            addresses = [ip for p in device.device.values() for ip in p.allowed_ips]
            assert len(addresses) == len(set(addresses)), "an address on two peers"
            assert await device.routes() == set(addresses)
        assert device.peer_reads == 1

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_the_full_pass_comes_every_resync_interval_after_an_incremental_one(
    autojump_clock,
):
    reconciler, device, registry = setup(range(16))
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(0.01)
        await trio.sleep(reconciler.resync_interval - 1)
        reads = device.peer_reads
        registry.batch(member(7, port=51900))  # an incremental pass, 1 s before the resync
        await trio.sleep(5)
        assert device.peer_reads == reads + 1, "no full pass a resync interval after the last"
        nursery.cancel_scope.cancel()


async def test_a_large_mesh_spaces_its_safety_net_pass_by_its_size(autojump_clock):
    """1024 members: the periodic full pass comes every 1024 / 8 = 128 s, not every 30 s,
    and still puts back a peer removed from the device behind the daemon's back."""
    reconciler, device, _registry = setup()
    assert reconciler.resync_period() == SIZE / FULL_PASS_PEERS == 128
    assert setup(range(16))[0].resync_period() == reconciler.resync_interval == 30
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(10)  # the first pass, and its peers' first handshakes checked
        assert len(device.device) == SIZE - 1 and not reconciler.handshakes.awaiting
        reads = device.peer_reads
        del device.device[key(9)]  # behind our back
        await trio.sleep(100)  # three of a small mesh's intervals
        assert device.peer_reads == reads, "a read of the device before N / 8 s"
        assert key(9) not in device.device
        await trio.sleep(19)  # 129 s from the first pass
        assert key(9) in device.device, "no safety-net pass N / 8 s after the last"
        nursery.cancel_scope.cancel()
