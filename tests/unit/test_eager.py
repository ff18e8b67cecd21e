"""Handshakes follow the traffic: the eager set, the lazy pair's endpoints, the doorbell's ring."""

from __future__ import annotations

import itertools
from ipaddress import ip_interface, ip_network

import pytest
from shared import key

from vnetd.control.watcher import MemberView
from vnetd.daemon.doorbell import is_initiation
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.mesh.eager import (
    doorbell_endpoint,
    eager_pair,
    eager_ranks,
    endpoint_of,
    tree_neighbours,
)
from vnetd.mesh.initiator import (
    RETRY_AFTER,
    RING_SETTLE,
    SESSION_DEAD,
    SESSION_FRESH,
    HandshakeWatch,
    PairRule,
)
from vnetd.mesh.peers import desired_peers, diff
from vnetd.mesh.rings import MAX_BELLS
from vnetd.model import DevicePeer, Member, Peer
from vnetd.spec import MeshSpec, parse_spec


def spec(fanout: int, size: int = 16, **mesh: object) -> MeshSpec:
    table = {"name": "m", "size": size, "network": "10.250.0.0/16", "tree_fanout": fanout}
    return parse_spec({"mesh": {**table, **mesh}})


@pytest.mark.parametrize(
    ("rank", "size", "fanout", "expected"),
    [
        pytest.param(0, 16, 2, {1, 2}, id="root-binary"),
        pytest.param(3, 16, 2, {1, 7, 8}, id="inner-binary"),
        pytest.param(7, 16, 2, {3, 15}, id="last-child-cut-by-size"),
        pytest.param(15, 16, 2, {7}, id="leaf"),
        pytest.param(0, 1024, 256, set(range(1, 257)), id="flux-operator-root"),
        pytest.param(300, 1024, 256, {1}, id="flux-operator-leaf"),
        pytest.param(2, 4, 1, {1, 3}, id="chain"),
        pytest.param(5, 16, 0, set(), id="off"),
    ],
)
def test_tree_neighbours_are_flux_k_ary_numbering(rank, size, fanout, expected):
    assert tree_neighbours(rank, size, fanout) == expected


@pytest.mark.parametrize("fanout", [1, 2, 3, 256])
def test_the_eager_pair_rule_is_symmetric_and_matches_the_eager_set(fanout):
    mesh = spec(fanout, size=40)
    for a, b in itertools.permutations(range(40), 2):
        assert eager_pair(mesh, a, b, same_site=True) == eager_pair(mesh, b, a, same_site=True)
        assert eager_pair(mesh, a, b, same_site=True) == (b in eager_ranks(a, mesh))


def test_eager_handshakes_per_formation_stay_within_n_times_fanout_plus_two():
    for size, fanout in [(1024, 256), (1024, 2), (100, 7)]:
        mesh = spec(fanout, size=size)
        pairs = sum(len(eager_ranks(r, mesh)) for r in range(size)) // 2
        assert pairs <= size * (fanout + 2)
        assert pairs == size - 1  # a tree: one edge per rank but the root


@pytest.mark.parametrize(
    ("fanout", "keepalive", "same_site", "eager"),
    [
        pytest.param(2, 0, True, False, id="lazy"),
        pytest.param(0, 0, True, True, id="rule-off-every-pair-eager"),
        pytest.param(2, 25, True, True, id="keepalives-nat"),
        pytest.param(2, 0, False, True, id="another-site"),
    ],
)
def test_pairs_needing_keepalives_or_sites_stay_eager(fanout, keepalive, same_site, eager):
    mesh = spec(fanout, persistent_keepalive=keepalive)
    assert eager_pair(mesh, 5, 9, same_site=same_site) is eager


def test_gateways_are_eager_with_everyone():
    mesh = parse_spec({
        "mesh": {"name": "m", "size": 16, "network": "10.250.0.0/16", "tree_fanout": 2},
        "sites": {"cloud": {"gateways": [9]}},
    })  # fmt: skip
    assert eager_pair(mesh, 5, 9, same_site=True)
    assert eager_pair(mesh, 9, 14, same_site=True)
    assert 9 in eager_ranks(5, mesh)
    assert eager_ranks(9, mesh) == set(range(16)) - {9}
    assert not eager_pair(mesh, 5, 14, same_site=True)


@pytest.mark.parametrize(
    ("endpoint", "port", "expected"),
    [
        pytest.param("198.18.1.4:51820", 51822, "198.18.1.4:51822", id="v4"),
        pytest.param("[fd00::4]:51820", 51822, "[fd00::4]:51822", id="v6"),
    ],
)
def test_doorbell_endpoint_is_the_peers_host_at_the_doorbell_port(endpoint, port, expected):
    assert doorbell_endpoint(endpoint, port) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("::ffff:198.18.1.4", "198.18.1.4:51820", id="mapped"),
        pytest.param("198.18.1.4", "198.18.1.4:51820", id="v4"),
        pytest.param("fd00::4", "[fd00::4]:51820", id="v6"),
    ],
)
def test_a_ring_source_reads_as_the_endpoint_the_registry_holds(host, expected):
    assert endpoint_of(host, 51820) == expected


def test_only_a_handshake_initiation_rings():
    assert is_initiation((1).to_bytes(4, "little") + bytes(144))
    assert not is_initiation((2).to_bytes(4, "little") + bytes(144))
    assert not is_initiation((1).to_bytes(4, "little") + bytes(10))


# --- the lazy pair on the device ---------------------------------------------------------


def members(size: int) -> dict[int, Member]:
    return {
        r: Member(r, key(r), f"198.18.1.{r}:51820", f"pod{r}", device_id=f"dev{r}")
        for r in range(size)
    }


def pair_rule(rank: int, mesh: MeshSpec, entries: dict[int, Member]) -> PairRule:
    created = {r: 10 + r for r in entries}
    return PairRule(key(rank), True, created[rank], created, 0, False, entries[rank], entries,
                    spec=mesh, self_rank=rank)  # fmt: skip


def added(rank: int, mesh: MeshSpec) -> dict[int, Peer]:
    entries = members(mesh.size)
    desired, _ = desired_peers(entries, rank, mesh, key(rank))
    plan = diff(desired, {}, {}, pairs=pair_rule(rank, mesh, entries))
    assert set(plan.handshake) <= {p.public_key for p in plan.add}
    started = {p.rank for p in plan.add if p.public_key in plan.handshake}
    assert started == {r for r in eager_ranks(rank, mesh) if r > rank}  # the earlier initiates
    return {p.rank: p for p in plan.add if p.rank is not None}


def test_a_lazy_pair_is_added_at_once_with_its_route_and_no_handshake_or_keepalive():
    mesh = spec(1, size=4)  # a chain: 0-1-2-3; 0-2, 0-3, 1-3 are lazy
    on0, on2 = added(0, mesh), added(2, mesh)
    assert set(on0) == {1, 2, 3} and on0[2].allowed_ips == ("10.250.0.3/32",)
    assert on0[2].endpoint == "198.18.1.2:51820"  # the initiator: the real endpoint
    assert on2[0].endpoint == "198.18.1.0:51822"  # the responder: the initiator's doorbell
    assert on0[2].keepalive == on2[0].keepalive == 0
    assert on0[1].keepalive and on0[1].endpoint == "198.18.1.1:51820"  # eager, as before
    assert not on0[2].endpoint_held and not on2[0].endpoint_held


def test_eager_rule_off_adds_every_pair_as_before():
    mesh = spec(0, size=4)
    assert added(0, mesh)[2].keepalive  # the idle keepalive of an eager initiator


def test_a_lazy_responder_that_comes_to_initiate_writes_the_real_endpoint():
    mesh = spec(1, size=4)
    entries = members(4)
    desired, _ = desired_peers(entries, 0, mesh, key(0))
    want = desired[key(2)]
    have = {key(2): DevicePeer(key(2), want.allowed_ips, "198.18.1.2:51822")}
    for k, p in desired.items():
        have.setdefault(k, DevicePeer(k, p.allowed_ips, p.endpoint))
    written = {k: p.endpoint for k, p in desired.items()}
    plan = diff(desired, have, written, pairs=pair_rule(0, mesh, entries))
    assert [(u.public_key, u.endpoint) for u in plan.update] == [(key(2), "198.18.1.2:51820")]
    handshaken = {key(2): DevicePeer(key(2), want.allowed_ips, "198.18.1.2:51822", 1.0)}
    plan = diff(desired, {**have, **handshaken}, written, pairs=pair_rule(0, mesh, entries))
    assert not plan.update  # a session roamed it: invariant 4


def test_a_restarted_device_of_a_lazy_peer_is_re_added_by_both_sides_without_a_handshake():
    mesh = spec(1, size=4)
    entries = {r: Member(r, key(r), f"198.18.1.{r}:51820", f"pod{r}", device_id="new")
               for r in range(4)}  # fmt: skip
    for rank, other in [(0, 2), (2, 0)]:
        desired, _ = desired_peers(entries, rank, mesh, key(rank))
        have = {k: DevicePeer(k, p.allowed_ips, p.endpoint) for k, p in desired.items()}
        devices = {k: "new" for k in desired} | {key(other): "old"}
        plan = diff(desired, have, {}, devices, pairs=pair_rule(rank, mesh, entries))
        assert [p.rank for p in plan.add] == [other] and [p.rank for p in plan.remove] == [other]
        assert not plan.handshake and not plan.left_restarted


# --- the ring ----------------------------------------------------------------------------


def ringer() -> Peer:
    return Peer(key(2), ("10.250.0.3/32",), "198.18.1.2:51820", 2, keepalive=0)


def device(tx: int = 0, last: float = 0.0) -> dict[str, DevicePeer]:
    return {key(2): DevicePeer(key(2), ("10.250.0.3/32",), "198.18.1.2:51820", last, 0, tx)}


def test_a_ring_starts_a_handshake_on_the_peer_as_it_is_and_watches_it():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    assert watch.next_check() == 100.0
    found = watch.check(device(tx=148), 100.0, wall=5000.0)
    # No re-add: ours may be under way (both sides at once); wireguard-go skips it then.
    assert found.plan.handshake == (key(2),) and not found.plan.add and not found.plan.remove
    assert found.plan and found.answered == [ringer()] and not watch.rung
    assert watch.next_check() == 100.0 + RING_SETTLE


def test_a_rings_handshake_that_did_not_come_is_re_added_after_the_settle_not_in_5s():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    watch.check(device(tx=148), 100.0, wall=5000.0)
    found = watch.check(device(tx=296), 100.0 + RING_SETTLE, wall=5000.3)
    assert [p.rank for p in found.plan.add] == [2] and [p.rank for p in found.plan.remove] == [2]
    assert found.plan.handshake == (key(2),)
    assert watch.next_check() == 100.0 + RING_SETTLE + RETRY_AFTER
    assert not watch.check(device(last=5000.4), 100.0 + RING_SETTLE + 1, wall=5001.0).plan
    assert not watch.initiating  # it came


def test_a_ring_during_a_live_session_is_a_stray():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    assert not watch.check(device(last=4900.0), 100.0, wall=4900.0 + SESSION_FRESH - 1).plan
    assert not watch.rung and not watch.initiating
    watch.ring(ringer(), 100.0)
    found = watch.check(device(last=4900.0), 100.0, wall=4900.0 + SESSION_FRESH + 1)
    assert found.plan.handshake == (key(2),)  # keys expired: the responder has none


def test_a_ring_for_a_peer_already_being_started_adds_nothing():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    watch.check(device(), 100.0, wall=5000.0)
    watch.ring(ringer(), 100.1)
    assert not watch.rung


@pytest.mark.parametrize(
    ("rank", "age", "wall", "written"),
    [
        pytest.param(2, SESSION_DEAD + 1, 10_000.0, "198.18.1.0:51822", id="responder-dead"),
        pytest.param(2, SESSION_DEAD - 30, 10_000.0, None, id="responder-live-session"),
        pytest.param(2, SESSION_DEAD + 1, 0.0, None, id="incremental-pass-no-device"),
        pytest.param(0, SESSION_DEAD + 1, 10_000.0, None, id="initiator-keeps-the-real-one"),
    ],
)
def test_a_lazy_responder_holds_the_doorbell_again_once_its_session_is_dead(
    rank, age, wall, written
):
    mesh = spec(1, size=4)
    entries = members(4)
    other = 2 - rank  # the pair 0-2
    desired, _ = desired_peers(entries, rank, mesh, key(rank))
    have = {k: DevicePeer(k, p.allowed_ips, p.endpoint) for k, p in desired.items()}
    # The session roamed the device to the other side's real endpoint.
    real = f"198.18.1.{other}:51820"
    have[key(other)] = DevicePeer(key(other), desired[key(other)].allowed_ips, real, 10_000 - age)
    endpoints = {k: p.endpoint for k, p in desired.items()}
    plan = diff(desired, have, endpoints, pairs=pair_rule(rank, mesh, entries), wall=wall)
    updates = {u.public_key: u.endpoint for u in plan.update}
    assert updates == ({} if written is None else {key(other): written})


def test_a_plain_wireguard_host_is_eager_it_has_no_doorbell():
    mesh = spec(1, size=4)
    entries = {**members(4), 2: Member(2, key(2), "198.18.1.2:51820", "register-host-2")}
    rule0, rule3 = pair_rule(0, mesh, entries), pair_rule(3, mesh, entries)
    host = Peer(key(2), ("10.250.0.3/32",), "198.18.1.2:51820", 2)
    assert not rule0.lazy(host) and not rule3.lazy(host)
    assert rule0.lazy(Peer(key(3), ("10.250.0.4/32",), "198.18.1.3:51820", 3))


# --- the reconciler takes the rings ----------------------------------------------------------


def lazy_reconciler(ranks: range) -> tuple[Reconciler, FakeDataplane, MemberView]:
    mesh = spec(1, size=4)
    config = DeviceConfig(
        "vnet0", key(9), 51820, ip_interface("10.250.0.1/16"), ip_network("10.250.0.0/16"), 1420
    )
    device = FakeDataplane(config)
    view = MemberView()
    view.members = {r: m for r, m in members(4).items() if r in ranks}
    view.created = {r: 100 + r for r in ranks}
    view.version, view.synced = 1, True
    return Reconciler(mesh, 0, key(0), view, device), device, view


async def test_a_ring_from_a_peer_not_known_yet_is_answered_once_it_is_added():
    reconciler, device, view = lazy_reconciler(range(2))  # rank 0; rank 2 not seen yet
    await reconciler.reconcile_once()
    reconciler.ring("198.18.1.2:51820")  # rank 2 (lazy with 0, and 0 initiates) knows us
    assert reconciler.stats.rings == 1 and not reconciler.handshakes.rung
    view.members[2], view.created[2] = members(4)[2], 102
    view.version += 1
    plan = await reconciler.reconcile_once(resync="rank 2 came")  # a full pass
    assert [p.rank for p in plan.add] == [2] and not plan.handshake  # lazy: added quietly
    assert set(reconciler.handshakes.rung) == {key(2)}  # the kept ring, now answered
    await reconciler.check_handshakes()
    assert device.handshakes[-1:] == [key(2)]
    assert reconciler.stats.handshakes_started == 1  # the eager pair 0-1 only


async def test_a_ring_from_an_eager_peer_or_one_that_initiates_is_a_stray():
    reconciler, _, _ = lazy_reconciler(range(4))
    await reconciler.reconcile_once()
    reconciler.ring("198.18.1.1:51820")  # eager (tree neighbours): never rings
    reconciler.ring("198.18.1.9:51820")  # nobody
    assert not reconciler.handshakes.rung


async def test_a_ring_before_the_first_list_waits_for_the_pass_that_follows_it():
    """A ring (real or forged) before the members are read decides nothing: the pair rule
    is not taken from an empty view (it would fix our join revision too early)."""
    reconciler, _, view = lazy_reconciler(range(4))
    view.synced = False
    reconciler.ring("198.18.1.2:51820")
    assert not reconciler.handshakes.rung and reconciler._listed_at is None
    view.synced = True
    await reconciler.reconcile_once()
    assert set(reconciler.handshakes.rung) == {key(2)}  # kept, and answered by the pass


async def test_a_flood_of_rings_keeps_at_most_max_bells():
    reconciler, _, _ = lazy_reconciler(range(4))
    await reconciler.reconcile_once()
    for port in range(MAX_BELLS + 100):  # from endpoints no peer has
        reconciler.ring(f"198.18.9.9:{port}")
    assert len(reconciler.rings.waiting) == MAX_BELLS
    assert reconciler.stats.rings == MAX_BELLS + 100
    assert reconciler.stats.rings_dropped == 100
