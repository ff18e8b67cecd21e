"""``split_plan``: a big plan becomes ``set`` transactions of bounded size (docs/architecture.md, reconciler)."""

from __future__ import annotations

from shared import wide_key as key

from vnetd.dataplane.codec.uapi_protocol import MAX_ADDS_PER_SET, split_plan
from vnetd.model import Peer, PeerUpdate, Plan


def peer(n: int) -> Peer:
    return Peer(key(n), (f"10.250.{n // 256}.{n % 256}/32",), f"198.18.2.{n % 256}:51820", rank=n)


def test_a_small_plan_stays_one_transaction() -> None:
    plan = Plan(
        remove=(peer(1),),
        update=(PeerUpdate(key(2), "198.18.3.2:51820"),),
        add=(peer(3), peer(4)),
        handshake=(key(3),),
    )
    assert split_plan(plan) == [plan]


def test_adds_are_split_and_each_keeps_its_handshake() -> None:
    adds = tuple(peer(n) for n in range(10, 10 + 2 * MAX_ADDS_PER_SET + 1))
    plan = Plan(
        remove=(peer(1),),
        update=(PeerUpdate(key(2), "198.18.3.2:51820"),),
        add=adds,
        handshake=tuple(p.public_key for p in adds[::2]),
    )
    parts = split_plan(plan)
    assert [len(p.add) for p in parts] == [MAX_ADDS_PER_SET, MAX_ADDS_PER_SET, 1]
    assert parts[0].remove == plan.remove and parts[0].update == plan.update
    assert all(not p.remove and not p.update for p in parts[1:])
    assert tuple(a for p in parts for a in p.add) == adds
    for part in parts:
        added = {a.public_key for a in part.add}
        assert set(part.handshake) == added & set(plan.handshake)
    assert sum(len(p.handshake) for p in parts) == len(plan.handshake)


def test_re_added_peers_go_in_the_first_transaction_with_their_removal() -> None:
    adds = tuple(peer(n) for n in range(10, 10 + MAX_ADDS_PER_SET + 5))
    readded = adds[-3:]
    plan = Plan(remove=readded, add=adds, handshake=tuple(p.public_key for p in readded))
    parts = split_plan(plan, max_adds=MAX_ADDS_PER_SET)
    assert parts[0].add[:3] == readded
    assert parts[0].remove == readded and parts[0].handshake == plan.handshake


def test_an_empty_plan_is_one_empty_transaction() -> None:
    assert split_plan(Plan()) == [Plan()]
