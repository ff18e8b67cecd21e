"""One initiator per pair across sites (invariant 10): the side that can reach the other starts.

Site a is public (its members advertise a public endpoint); site b is behind a
NAT with no forwarded port (no public endpoint) unless said otherwise.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace
from ipaddress import ip_interface, ip_network

import pytest
import trio
import trio.testing
from shared import key
from test_daemon import Cluster

from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.mesh.initiator import PairRule
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member, Peer
from vnetd.spec import SiteSpec, parse_spec

MESH = {"name": "m", "size": 10, "network": "10.250.0.0/16"}


def member(rank: int, site: str = "default", public: bool = False) -> Member:
    endpoint = f"10.{len(site)}.0.{rank}:51820"
    public_endpoint = f"198.18.0.{rank}:{40000 + rank}" if public else None
    return Member(rank, key(rank), endpoint, f"pod{rank}", 1.0, "v", "", site, public_endpoint)


def rule(rank: int, members: dict[int, Member], created: dict[int, int]) -> PairRule:
    mine = members[rank]
    return PairRule(key(rank), True, created.get(rank), created, 0, True, mine, members)


def pair_of(a: Member, b: Member) -> Peer:
    """``b`` as a peer of ``a``, with the endpoint ``a`` uses for it."""
    return Peer(key(b.rank), (f"10.250.0.{b.rank + 1}/32",), b.endpoint_from(a.site), b.rank)


def starts(members: dict[int, Member], created: dict[int, int], a: int, b: int) -> bool:
    """Rank ``a`` starts the pair with ``b``; asserts ``b`` computes the same."""
    mine = rule(a, members, created).initiates(pair_of(members[a], members[b]))
    theirs = rule(b, members, created).initiates(pair_of(members[b], members[a]))
    assert mine != theirs, (a, b)
    return mine


CREATED = [
    pytest.param({0: 10, 1: 20, 2: 30, 3: 40}, id="a-first"),
    pytest.param({0: 40, 1: 30, 2: 20, 3: 10}, id="b-first"),
]


@pytest.mark.parametrize("created", CREATED)
def test_within_a_site_the_earlier_registration_initiates_as_before(created):
    members = {r: member(r) for r in range(4)}
    for a, b in itertools.permutations(range(4), 2):
        before = PairRule(key(a), True, created[a], created).initiates(
            pair_of(members[a], members[b])
        )
        assert starts(members, created, a, b) == before == (created[a] < created[b])


@pytest.mark.parametrize("created", CREATED)
def test_across_sites_the_side_that_alone_can_reach_the_other_initiates(created):
    # 0, 1 in site a (public); 2, 3 in site b (no public endpoint): b reaches a only.
    members = {
        0: member(0, "a", True),
        1: member(1, "a", True),
        2: member(2, "b"),
        3: member(3, "b"),
    }
    for a, b in ((0, 2), (0, 3), (1, 2), (1, 3)):
        assert not starts(members, created, a, b), "b initiates, whatever the order"
        assert starts(members, created, b, a)
    # Within each site, the registration order as before.
    assert starts(members, created, 0, 1) == (created[0] < created[1])
    assert starts(members, created, 2, 3) == (created[2] < created[3])


@pytest.mark.parametrize("created", CREATED)
@pytest.mark.parametrize("public", [True, False], ids=["both-reach", "neither-reaches"])
def test_across_sites_both_or_neither_reaching_falls_back_to_the_order(created, public):
    members = {0: member(0, "a", public), 2: member(2, "b", public)}
    assert starts(members, created, 0, 2) == (created[0] < created[2])


def test_an_unknown_entry_falls_back_to_the_order():
    members = {0: member(0, "a", True), 2: member(2, "b")}
    created = {0: 10, 2: 20}
    # Our own entry unknown (no self_member): the order decides.
    assert PairRule(key(0), True, 10, created, members=members).initiates(
        pair_of(members[0], members[2])
    )
    # The peer's entry unknown: the order decides.
    assert PairRule(key(0), True, 10, created, self_member=members[0]).initiates(
        pair_of(members[0], members[2])
    )


def test_in_a_gateway_mesh_every_pair_has_one_initiator_that_can_reach_the_other():
    """Site a (0-3) public; site b (4-7) behind gateways 4 and 5; site c (8, 9) behind
    a plain NAT without gateways (reachable only by what it sends)."""
    spec = parse_spec({"mesh": MESH, "sites": {"b": {"gateways": [4, 5]}}})
    site = {**dict.fromkeys(range(4), "a"), **dict.fromkeys(range(4, 8), "b"), 8: "c", 9: "c"}
    members = {r: member(r, site[r], r < 6) for r in range(10)}
    created = {r: 100 - r for r in range(10)}  # the later ranks registered first
    peers_of = {
        me: desired_peers(members, me, replace(spec, site=SiteSpec(site[me])))[0]
        for me in range(10)
    }
    pairs = 0
    for me, peers in peers_of.items():
        for peer in peers.values():
            assert peer.rank is not None
            theirs = peers_of[peer.rank][key(me)]  # a peer entry is always mutual
            mine = rule(me, members, created).initiates(peer)
            assert mine != rule(peer.rank, members, created).initiates(theirs)
            if peer.endpoint is None or theirs.endpoint is None:
                assert mine == (peer.endpoint is not None), (me, peer.rank)
            else:
                assert mine == (created[me] < created[peer.rank]), (me, peer.rank)
            pairs += 1
    assert pairs % 2 == 0
    # Site c reaches the gateways and site a, never the other way round.
    for far in (0, 3, 4, 5):
        assert rule(8, members, created).initiates(peers_of[8][key(far)])
        assert not rule(far, members, created).initiates(peers_of[far][key(8)])


# --- one reconciler on a fake device -------------------------------------------------------------


def reconciler_for(
    me: int, members: dict[int, Member], created: dict[int, int], site: str | None = None
) -> Reconciler:
    config = DeviceConfig(
        "vnet0", key(9), 51820, ip_interface("10.250.0.1/16"), ip_network("10.250.0.0/16"), 1420
    )
    view = MemberView()
    view.members, view.created = dict(members), dict(created)
    view.version, view.synced = 1, True
    spec = replace(parse_spec({"mesh": MESH}), site=SiteSpec(site or members[me].site))
    return Reconciler(spec, me, key(me), view, FakeDataplane(config))


async def test_the_unreachable_earlier_side_leaves_the_pair_to_the_later_one(autojump_clock):
    """Rank 0 (site a, public) registered first; rank 1 (site b, behind NAT) joins:
    rank 1 starts the handshake at once, rank 0 waits for it without retrying."""
    members = {0: member(0, "a", True), 1: member(1, "b")}
    created = {0: 100, 1: 200}

    joiner = reconciler_for(1, members, created)
    plan = await joiner.reconcile_once()
    assert plan.handshake == (key(0),), "no 2 s wait for a fallback"
    (added,) = plan.add
    assert (added.endpoint, added.endpoint_held) == ("198.18.0.0:40000", False)
    assert set(joiner.handshakes.initiating) == {key(0)}
    assert joiner.handshakes.awaiting == {}

    earlier = reconciler_for(0, members, created)
    plan = await earlier.reconcile_once()
    assert plan.handshake == ()
    (added,) = plan.add
    assert added.endpoint is None
    assert earlier.handshakes.next_check() == math.inf, "nothing to retry nor fall back"


async def test_a_joiner_behind_nat_starts_the_pair_as_soon_as_it_is_registered(
    autojump_clock, caplog
):
    """Before its claim the joiner holds rank 0 back (nobody knows it yet); the pass
    right after the claim starts the handshake, with no wait for a fallback."""
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    members = {0: member(0, "a", True), 1: member(1, "b")}
    reconciler = reconciler_for(1, {0: members[0]}, {0: 100}, "b")
    reconciler.dataplane.answers = False  # type: ignore[attr-defined]
    plan = await reconciler.reconcile_once()
    assert plan.handshake == () and [p.endpoint_held for p in plan.add] == [True]
    reconciler.view.members[1], reconciler.view.created[1] = members[1], 200
    reconciler.view._bump()
    plan = await reconciler.reconcile_once()
    assert plan.handshake == (key(0),)
    (added,) = plan.add
    assert (added.endpoint, added.endpoint_held) == ("198.18.0.0:40000", False)
    assert reconciler.handshakes.awaiting == {}
    # Said as what it is, not as a device restart (the peer's device id is unchanged).
    assert "peer rank 0: ours to start now that this rank is registered" in caplog.text
    assert "restarted its device" not in caplog.text
    assert reconciler.stats.device_restarts == 0


async def test_an_initiator_without_an_endpoint_does_not_retry(autojump_clock):
    """Neither side can reach the other (two NATs, no gateways): the earlier one
    initiates by the order, but re-adding a peer it has no endpoint for sends nothing."""
    members = {0: member(0, "a"), 1: member(1, "b")}
    reconciler = reconciler_for(0, members, {0: 100, 1: 200})
    reconciler.dataplane.answers = False  # type: ignore[attr-defined]
    plan = await reconciler.reconcile_once()
    assert plan.handshake == (key(1),)
    assert reconciler.handshakes.initiating == {}
    assert reconciler.handshakes.next_check() == math.inf


# --- several daemons (MemoryRegistry + FakeDataplane) --------------------------------------------


async def test_a_burst_site_behind_nat_joins_with_no_fallback(tmp_path, autojump_clock):
    """Rank 0 in public site a starts first; ranks 1-3 join from site b behind a NAT.
    Rank 0 starts no cross-site pair (it could not reach b): no retry, no fallback."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await cluster.start(0, site="a", public_endpoint="198.18.0.1:40000")
        await trio.sleep(0.5)
        for rank in (2, 1, 3):
            await cluster.start(rank, site="b")
            await trio.sleep(0.5)
        names = [f"pod{r}" for r in range(4)]
        await cluster.wait_full(names, {0, 1, 2, 3})
        await trio.sleep(5)
        # The fake's far side answers a held peer at once, as an initiator would, so
        # b's own start shows in the test above; here: a never starts one with b.
        assert cluster.devices["pod0"].handshakes == []
        for name in names:
            stats = cluster.running[name].reconciler.stats
            assert (stats.handshake_retries, stats.fallbacks) == (0, 0), name
        nursery.cancel_scope.cancel()


async def test_a_gateway_mesh_forms_with_no_fallback(tmp_path, autojump_clock):
    """Site a: rank 0 (public). Site b: gateway 1 (public), members 2, 3 (no public
    endpoint), reached from a through the gateway."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        cluster.config.write_text(cluster.config.read_text() + "[sites.b]\ngateways = [1]\n")
        await cluster.start(2, site="b")
        await trio.sleep(0.5)
        await cluster.start(0, site="a", public_endpoint="198.18.0.1:40000")
        await trio.sleep(0.5)
        await cluster.start(1, site="b", public_endpoint="198.18.0.2:40001")
        await trio.sleep(0.5)
        await cluster.start(3, site="b")
        names = [f"pod{r}" for r in range(4)]
        await cluster.wait_full(names, {0, 1, 2, 3})
        await trio.sleep(5)
        for name in names:
            stats = cluster.running[name].reconciler.stats
            assert (stats.handshake_retries, stats.fallbacks) == (0, 0), name
        nursery.cancel_scope.cancel()
