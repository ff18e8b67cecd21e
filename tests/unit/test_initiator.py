"""One initiator per pair (invariant 10): the rule, the retry, the waiting side, the fallback."""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace
from ipaddress import ip_interface, ip_network

import pytest
import trio
import trio.testing
from shared import SPEC, key
from test_daemon import Cluster

from vnetd.control.membership import encode_member, member_key
from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import DataplaneError
from vnetd.mesh.initiator import (
    EARLY_CHECK,
    FALLBACK_AFTER,
    IDLE_KEEPALIVE,
    RACE_WINDOW,
    RETRIES,
    RETRY_AFTER,
    PairRule,
)
from vnetd.model import DevicePeer, Member, Peer, Plan
from vnetd.registry.base import WatchEvent


def peer(rank: int) -> Peer:
    return Peer(key(rank), (f"10.250.0.{rank + 1}/32",), f"198.18.1.{rank}:51820", rank)


# --- the rule ----------------------------------------------------------------------------------


def rule(
    rank: int,
    created: dict[int, int],
    *,
    registered: bool = True,
    keepalive: int = 0,
    joining: bool = True,
) -> PairRule:
    return PairRule(key(rank), registered, created.get(rank), created, keepalive, joining)


@pytest.mark.parametrize(
    "created",
    [
        pytest.param({0: 40, 1: 12, 2: 30, 3: 7}, id="by-create-revision"),
        pytest.param({}, id="unknown-revisions-by-key"),
        pytest.param({0: 5, 1: 5, 2: 9, 3: 9}, id="ties-by-key"),
    ],
)
def test_exactly_one_side_of_each_pair_initiates(created):
    for a, b in itertools.permutations(range(4), 2):
        mine, theirs = rule(a, created).initiates(peer(b)), rule(b, created).initiates(peer(a))
        assert mine != theirs, (a, b)
        order = (created.get(a, math.inf), key(a)) < (created.get(b, math.inf), key(b))
        assert mine == order, "the earlier registration initiates"


def test_a_joiner_initiates_with_nobody_before_its_claim_and_holds_endpoints_back():
    joiner = rule(3, {0: 4, 1: 5}, registered=False)
    assert not any(joiner.initiates(peer(r)) for r in (0, 1, 2))
    assert joiner.holds_back
    # Registered, it still holds back a member seen late (registered before it, after
    # its list): that member initiates as soon as it has seen the join.
    assert rule(3, {0: 4, 1: 5, 3: 9}).holds_back
    # A daemon that took its entry over holds nothing back: its peers know it.
    assert not rule(3, {0: 4, 1: 5, 3: 9}, joining=False).holds_back


@pytest.mark.parametrize(
    ("spec", "initiator", "responder"),
    [
        pytest.param(0, IDLE_KEEPALIVE, 0, id="none-in-the-spec"),
        pytest.param(10, 10, 10, id="nat-keepalive-below-ours"),
        pytest.param(120, IDLE_KEEPALIVE, 120, id="nat-keepalive-above-ours"),
    ],
)
def test_only_the_initiator_keeps_an_idle_session_alive(spec, initiator, responder):
    created = {0: 1, 1: 2}
    assert rule(0, created, keepalive=spec).keepalive(peer(1)) == initiator
    assert rule(1, created, keepalive=spec).keepalive(peer(0)) == responder


# --- one reconciler on a fake device -------------------------------------------------------------


def setup(
    self_rank: int, ranks: range = range(4), *, registered: bool = True
) -> tuple[Reconciler, FakeDataplane, MemberView]:
    config = DeviceConfig(
        "vnet0", key(9), 51820, ip_interface("10.250.0.1/16"), ip_network("10.250.0.0/16"), 1420
    )
    device = FakeDataplane(config)
    view = MemberView()
    view.members = {r: Member(r, key(r), f"198.18.1.{r}:51820", f"pod{r}") for r in ranks}
    view.created = {r: 100 + r for r in ranks}
    if not registered:
        view.members.pop(self_rank, None)
        view.created.pop(self_rank, None)
    view.version = 1
    view.synced = True
    return Reconciler(SPEC, self_rank, key(self_rank), view, device), device, view


def put(view: MemberView, member: Member) -> None:
    """``member`` rewrites its rank's entry (same create revision), as the watch delivers it."""
    value = encode_member(member)
    view.apply(
        SPEC,
        WatchEvent("put", member_key(SPEC, member.rank), value, 0, view.created[member.rank], 1),
    )


class CountingFake(FakeDataplane):
    reads = 0

    async def peers(self) -> dict[str, DevicePeer]:
        self.reads += 1
        return await super().peers()


async def test_the_initiator_starts_at_once_with_its_keepalive(autojump_clock):
    reconciler, device, _ = setup(1)
    plan = await reconciler.reconcile_once()
    assert plan.handshake == (key(2), key(3))  # not with rank 0: it registered first
    added = {p.public_key: p for p in plan.add}
    assert added[key(0)].endpoint == "198.18.1.0:51820" and added[key(0)].endpoint_held
    assert not added[key(2)].endpoint_held
    assert device.keepalives == {key(0): 0, key(2): IDLE_KEEPALIVE, key(3): IDLE_KEEPALIVE}


async def test_a_lost_first_handshake_is_retried_after_about_a_second(autojump_clock):
    reconciler, device, _ = setup(0)
    device.answers = False  # the first handshakes are lost
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(0.01)
        joined = trio.current_time()
        assert set(device.handshakes) == {key(1), key(2), key(3)}
        device.device[key(3)] = replace(device.device[key(3)], last_handshake=1234.0)
        while len(device.applied) < 2:
            await trio.sleep(0.01)
        retried_after = trio.current_time() - joined
        assert RETRY_AFTER - 0.05 <= retried_after <= RETRY_AFTER + 0.05
        retry = device.applied[1]
        assert [p.public_key for p in retry.remove] == [key(1), key(2)]
        assert [p.public_key for p in retry.add] == [key(1), key(2)]
        assert retry.handshake == (key(1), key(2))
        assert retry.add[0].endpoint == "198.18.1.1:51820"
        assert device.keepalives[key(1)] == IDLE_KEEPALIVE
        assert await device.routes() == {"10.250.0.2/32", "10.250.0.3/32", "10.250.0.4/32"}
        assert reconciler.stats.handshake_retries == 2
        nursery.cancel_scope.cancel()


async def test_a_peer_registered_just_after_our_join_is_checked_early(autojump_clock):
    """Two ranks that register at about the same time: the later one listed the members
    before the earlier one registered, so it adds the earlier one only from its watch and
    drops that one's first initiation (traced in the lab). The earlier one re-adds after
    ``EARLY_CHECK``; a peer that joins later, once our join is past, after ``RETRY_AFTER``."""
    reconciler, device, view = setup(1, range(1), registered=False)
    device.answers = False
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(0.01)  # the first pass, from the list: rank 0, held
        view.members[1] = Member(1, key(1), "198.18.1.1:51820", "pod1")
        view.created[1] = 200
        view.members[2] = Member(2, key(2), "198.18.1.2:51820", "pod2")
        view.created[2] = 201  # registered right after us
        view._bump()
        while len(device.applied) < 2:
            await trio.sleep(0.01)
        assert device.applied[1].handshake == (key(2),)
        started = trio.current_time()
        while len(device.applied) < 3:
            await trio.sleep(0.01)
        assert trio.current_time() - started == pytest.approx(EARLY_CHECK, abs=0.05)
        retry = device.applied[2]
        assert tuple(p.public_key for p in retry.add) == retry.handshake == (key(2),)
        device.device[key(2)] = replace(device.device[key(2)], last_handshake=1234.0)

        await trio.sleep(RACE_WINDOW)  # (rank 0's fallback is written meanwhile)
        view.members[3] = Member(3, key(3), "198.18.1.3:51820", "pod3")
        view.created[3] = 202
        view._bump()
        applied = len(device.applied)
        while len(device.applied) < applied + 1:
            await trio.sleep(0.01)
        assert device.applied[-1].handshake == (key(3),)
        started = trio.current_time()
        while len(device.applied) < applied + 2:
            await trio.sleep(0.01)
        assert trio.current_time() - started == pytest.approx(RETRY_AFTER, abs=0.05)
        assert device.applied[-1].handshake == (key(3),)
        nursery.cancel_scope.cancel()


async def test_retries_are_bounded_then_left_to_wireguard(autojump_clock, caplog):
    reconciler, device, _ = setup(0, range(2))
    device = CountingFake(device.config)
    reconciler.dataplane = device
    reconciler.resync_interval = 300.0
    device.answers = False
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(20)
        assert len(device.applied) == 1 + RETRIES
        reads = device.reads
        await trio.sleep(20)
        assert device.reads == reads, "polled the device with nothing due"
        assert "rank 1: still no handshake after 4 tries; leaving it to WireGuard" in caplog.text
        nursery.cancel_scope.cancel()


async def test_a_completed_handshake_costs_one_device_read(autojump_clock):
    reconciler, device, _ = setup(0)
    device = CountingFake(device.config)
    reconciler.dataplane = device
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(25)  # before the periodic resync
        assert device.reads == 2  # the pass, then one look at the new peers' handshakes
        assert len(device.applied) == 1
        nursery.cancel_scope.cancel()


async def test_the_responder_waits_for_the_initiator_and_falls_back(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    """Before its claim a joiner adds every member with its endpoint held; once it is
    registered it waits ``FALLBACK_AFTER`` for each one's handshake, then writes the
    endpoint of those that did not come."""
    reconciler, device, view = setup(3, registered=False)
    device.answers = False
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(0.01)
        (plan,) = device.applied
        assert plan.handshake == ()
        assert all(p.endpoint_held for p in plan.add)
        assert {p.endpoint for p in device.device.values()} == {None}
        await trio.sleep(10)  # not registered: nobody knows us, so nobody is late
        assert len(device.applied) == 1

        view.members[3] = Member(3, key(3), "198.18.1.3:51820", "pod3")
        view.created[3] = 200
        view._bump()
        registered = trio.current_time()
        # Rank 0's handshake arrives (it teaches us its endpoint); rank 1's starts.
        await trio.sleep(0.5)
        device.device[key(0)] = replace(
            device.device[key(0)], endpoint="198.18.1.0:51820", last_handshake=1234.0
        )
        device.device[key(1)] = replace(device.device[key(1)], endpoint="198.18.1.1:51820")
        while len(device.applied) < 2:
            await trio.sleep(0.01)
        assert trio.current_time() - registered == pytest.approx(FALLBACK_AFTER, abs=0.05)
        fallback = device.applied[1]
        assert (fallback.remove, fallback.add, fallback.handshake) == ((), (), ())
        assert [(u.public_key, u.endpoint) for u in fallback.update] == [
            (key(2), "198.18.1.2:51820")
        ]  # our own packets for it, if any, now start the handshake
        assert device.device[key(2)].endpoint == "198.18.1.2:51820"
        assert reconciler.stats.fallbacks == 1
        assert "peer rank 2: its handshake did not come within 2.0 s" in caplog.text
        await trio.sleep(10)
        assert len(device.applied) == 2, "the fallback is written once"
        nursery.cancel_scope.cancel()


async def test_a_waiting_peer_gets_no_endpoint_written(autojump_clock):
    reconciler, device, view = setup(3, registered=False)
    device.answers = False
    await reconciler.reconcile_once()
    put(view, replace(view.members[1], endpoint="198.18.9.9:51820"))
    assert not await reconciler.reconcile_once()
    assert device.device[key(1)].endpoint is None
    # Once the initiator's handshake has taught the device an endpoint, a new one in the
    # registry is written as for any peer (invariant 4).
    device.device[key(2)] = replace(device.device[key(2)], endpoint="198.18.1.2:51820")
    put(view, replace(view.members[2], endpoint="198.18.7.7:51820"))
    (moved,) = (await reconciler.reconcile_once()).update
    assert (moved.public_key, moved.endpoint) == (key(2), "198.18.7.7:51820")
    # The fallback, when it comes, writes the registry's endpoint of then.
    assert reconciler.handshakes.check(await device.peers(), math.inf).fallbacks == []
    reconciler.handshakes.registered(0.0)
    found = reconciler.handshakes.check(await device.peers(), math.inf)
    assert {u.public_key: u.endpoint for u in found.plan.update}[key(1)] == "198.18.9.9:51820"


async def test_a_held_peer_ours_to_start_once_registered_gets_a_handshake(autojump_clock):
    """A daemon restarted with a new key (a rotation) is not registered until it has
    taken its entry over: it holds every peer back, then starts the handshakes of
    the pairs its (old) registration comes first in."""
    reconciler, device, view = setup(1, registered=False)
    device.answers = False
    view.created[1] = 50  # its entry, still under the old key, registered first
    view.members[1] = Member(1, key(8), "198.18.1.1:51820", "pod1")
    view.revision = 500
    plan = await reconciler.reconcile_once()
    assert plan.handshake == () and all(p.endpoint_held for p in plan.add)
    view.members[1] = Member(1, key(1), "198.18.1.1:51820", "pod1")  # taken over
    plan = await reconciler.reconcile_once()
    assert plan.handshake == (key(0), key(2), key(3))
    assert [p.public_key for p in plan.remove] == [key(0), key(2), key(3)]
    assert not any(p.endpoint_held for p in plan.add)
    assert set(reconciler.handshakes.initiating) == {key(0), key(2), key(3)}
    assert reconciler.handshakes.awaiting == {}


async def test_a_registered_responder_adds_with_the_endpoint_and_waits_for_nothing(
    autojump_clock,
):
    """A daemon restarted within its lease is still registered: its peers know its key,
    so a new device adds them with their endpoints (its traffic may start a session)."""
    reconciler, device, view = setup(3)
    view.revision = 500  # its first list already held its entry: taken over, not created
    plan = await reconciler.reconcile_once()
    assert plan.handshake == ()
    assert not any(p.endpoint_held for p in plan.add)
    assert reconciler.handshakes.next_check() == math.inf


# --- several daemons (MemoryRegistry + FakeDataplane) --------------------------------------------


async def test_in_a_mesh_exactly_one_side_of_each_pair_starts_the_handshake(
    tmp_path, autojump_clock
):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (2, 0, 3, 1):
            await cluster.start(rank)
            await trio.sleep(0.5)
        names = [f"pod{r}" for r in range(4)]
        await cluster.wait_full(names, {0, 1, 2, 3})
        await trio.sleep(5)
        order = [2, 0, 3, 1]  # registration order
        keys = {r: cluster.running[f"pod{r}"].me.public_key for r in range(4)}
        for a, b in itertools.combinations(range(4), 2):
            first, later = sorted((a, b), key=order.index)
            assert cluster.devices[f"pod{first}"].handshakes.count(keys[later]) == 1
            assert keys[first] not in cluster.devices[f"pod{later}"].handshakes
            # The later one added the earlier before its claim, endpoint held.
            adds = [p for plan in cluster.devices[f"pod{later}"].applied for p in plan.add]
            assert [p.endpoint_held for p in adds if p.public_key == keys[first]] == [True]
        for name in names:
            stats = cluster.running[name].reconciler.stats
            assert (stats.handshake_retries, stats.fallbacks) == (0, 0)
        nursery.cancel_scope.cancel()


class RefusesFirstFallback(FakeDataplane):
    """Refuses the first plan that only updates endpoints (a responder's fallback)."""

    refused = False

    async def apply(self, plan: Plan) -> None:
        if plan.update and not plan.add and not plan.remove and not self.refused:
            self.refused = True
            raise DataplaneError("UAPI: refused")
        await super().apply(plan)


async def test_a_refused_fallback_is_written_at_the_next_check(autojump_clock):
    reconciler, device, view = setup(3, registered=False)
    device = reconciler.dataplane = RefusesFirstFallback(device.config)
    device.answers = False
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(0.01)
        view.members[3] = Member(3, key(3), "198.18.1.3:51820", "pod3")
        view.created[3] = 200
        view._bump()
        await trio.sleep(FALLBACK_AFTER + 5)  # well below a resync, which would not help
        assert device.refused
        assert device.device[key(0)].endpoint == "198.18.1.0:51820", "the fallback was lost"
        nursery.cancel_scope.cancel()


class RemovesThenRefuses(FakeDataplane):
    """The first retry (remove, then add) stops after its removes, as a refused set can."""

    refused = False

    async def apply(self, plan: Plan) -> None:
        if plan.remove and plan.add and self.applied and not self.refused:
            self.refused = True
            for peer in plan.remove:
                self.device.pop(peer.public_key, None)
            raise DataplaneError("UAPI: refused half way")
        await super().apply(plan)


async def test_a_half_applied_retry_is_repaired_by_the_next_pass(autojump_clock):
    reconciler, device, _ = setup(0, range(2))
    device = reconciler.dataplane = RemovesThenRefuses(device.config)
    device.answers = False
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(RETRY_AFTER + 0.5)
        assert device.refused
        await trio.sleep(5)  # a backoff, then a full pass: well below the 30 s resync
        assert key(1) in device.device, "the peer stayed off the device"
        nursery.cancel_scope.cancel()
