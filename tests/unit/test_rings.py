"""What a doorbell ring costs is bounded: looked up by endpoint, a repeat within a second
dropped, and the device reads that answer rings spaced (``mesh.rings``); a ring taken
for a stray is answered if its peer is re-added soon after."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
from shared import key
from test_eager import device, lazy_reconciler, ringer

from vnetd.mesh.initiator import (
    MAX_READ_SPACING,
    READ_COST_PER_PEER,
    READ_SHARE,
    READ_SPACING,
    STRAY_MEMORY,
    HandshakeWatch,
)
from vnetd.mesh.peers import AppliedPeers
from vnetd.mesh.rings import MAX_BELLS, RING_MEMORY, RING_REPEAT, RingBook
from vnetd.model import Peer, Plan


def peer(n: int, endpoint: str | None) -> Peer:
    return Peer(key(n), (f"10.250.0.{n + 1}/32",), endpoint, n)


def at(table: dict[str, list[Peer]]):
    return lambda endpoint: table.get(endpoint, [])


# --- the book of rings ---------------------------------------------------------------------


def test_a_repeat_within_a_second_is_dropped_and_taken_again_after():
    book = RingBook()
    assert book.take("198.18.1.2:51820", 100.0)
    assert not book.take("198.18.1.2:51820", 100.0 + RING_REPEAT - 0.01)
    assert book.take("198.18.1.3:51820", 100.5)  # another endpoint is its own
    assert book.take("198.18.1.2:51820", 100.0 + RING_REPEAT)


def test_a_waiting_ring_is_answered_once_a_peer_is_at_its_endpoint_and_then_leaves():
    book = RingBook()
    book.take("198.18.1.2:51820", 100.0)
    assert book.answered(at({}), 101.0) == []
    assert list(book.waiting) == ["198.18.1.2:51820"]  # kept: the peer may come
    found = book.answered(at({"198.18.1.2:51820": [peer(2, "198.18.1.2:51820")]}), 102.0)
    assert [p.rank for p in found] == [2] and not book.waiting


def test_a_waiting_ring_expires_after_ring_memory():
    book = RingBook()
    book.take("198.18.1.2:51820", 100.0)
    book.take("198.18.1.3:51820", 103.0)
    peers = at({"198.18.1.2:51820": [peer(2, "198.18.1.2:51820")]})
    assert book.answered(peers, 100.0 + RING_MEMORY) == []
    assert list(book.waiting) == ["198.18.1.3:51820"]


def test_only_looks_up_that_endpoint_alone():
    book = RingBook()
    book.take("198.18.1.2:51820", 100.0)
    book.take("198.18.1.3:51820", 100.0)
    asked: list[str] = []

    def lookup(endpoint: str) -> list[Peer]:
        asked.append(endpoint)
        return []

    book.answered(lookup, 100.1, only="198.18.1.3:51820")
    assert asked == ["198.18.1.3:51820"]
    book.answered(lookup, 100.1, only="198.18.9.9:1")  # no ring of its own: nothing
    assert asked == ["198.18.1.3:51820"]


def test_a_flood_of_new_endpoints_fills_the_book_and_no_more():
    book = RingBook()
    taken = sum(book.take(f"198.18.9.9:{port}", 100.0) for port in range(MAX_BELLS + 50))
    assert taken == MAX_BELLS and len(book.waiting) == MAX_BELLS
    # A second later the repeat table has room again; the waiting table frees at 5 s.
    assert not book.take("198.18.1.2:51820", 100.0 + RING_REPEAT)
    assert book.take("198.18.1.2:51820", 100.0 + RING_MEMORY)


def test_a_flood_from_unknown_endpoints_does_not_shut_out_a_known_peers_ring():
    book = RingBook()
    for port in range(MAX_BELLS + 10):
        book.take(f"198.18.9.9:{port}", 100.0)
    assert not book.take("198.18.1.2:51820", 100.1)  # unknown: the cap holds
    assert book.take("198.18.1.3:51820", 100.1, known=True)  # a peer we hold is there
    assert not book.take("198.18.1.3:51820", 100.2, known=True)  # but not twice a second


# --- the applied peers, by endpoint ---------------------------------------------------------


def test_the_endpoint_index_follows_what_is_applied():
    applied = AppliedPeers()
    two, three = peer(2, "198.18.1.2:51820"), peer(3, "198.18.1.3:51820")
    applied.applied({key(2): two, key(3): three}, None)
    assert applied.at("198.18.1.2:51820") == [two]
    moved = peer(2, "198.18.7.2:51820")
    applied.applied({key(2): moved}, [key(2)])
    assert applied.at("198.18.1.2:51820") == [] and applied.at("198.18.7.2:51820") == [moved]
    applied.applied({}, [key(3)])  # gone
    assert applied.at("198.18.1.3:51820") == []
    shared = peer(4, "198.18.7.2:51820")  # a new key at an endpoint another still holds
    applied.applied({key(4): shared}, [key(4)])
    assert sorted(p.rank for p in applied.at("198.18.7.2:51820")) == [2, 4]
    applied.applied({key(4): peer(4, None)}, None)  # a full pass: rebuilt
    assert applied.at("198.18.7.2:51820") == [] and applied.peers[key(4)].endpoint is None


# --- the device reads that answer rings -----------------------------------------------------


def test_rings_after_a_read_wait_for_the_spacing_and_share_the_next_read():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    assert watch.next_check() == 100.0  # the first ring: at once
    watch.check(device(tx=148), 100.0, wall=5000.0)
    watch.initiating.clear()  # its handshake came
    watch.ring(ringer(), 100.01)
    assert watch.next_check() == 100.0 + READ_SPACING


def test_a_slow_read_spaces_every_check_by_its_share():
    """Rings, their settle and retries all wait for the spacing: a flood of forged rings
    for peers we hold costs at most ``READ_SHARE`` of a core in device reads."""
    watch = HandshakeWatch()
    watch.read_took(8000)  # a read of a large device
    spacing = 8000 * READ_COST_PER_PEER / READ_SHARE
    assert spacing == pytest.approx(0.4)
    watch.ring(ringer(), 100.0)
    watch.check(device(tx=148), 100.0, wall=5000.0)  # its settle is due 0.25 s later
    assert watch.next_check() == pytest.approx(100.0 + spacing)  # the spacing wins
    watch.initiating.clear()
    watch.ring(ringer(), 100.01)
    assert watch.next_check() == pytest.approx(100.0 + spacing)
    watch.read_took(2)
    assert watch.read_spacing == READ_SPACING
    assert HandshakeWatch().next_check() == float("inf")


# --- the reconciler ------------------------------------------------------------------------


async def test_the_reconciler_counts_a_repeated_ring_as_dropped_and_answers_it_once(
    autojump_clock,
):
    reconciler, device_, _ = lazy_reconciler(range(4))
    await reconciler.reconcile_once()
    reconciler.ring("198.18.1.2:51820")
    reconciler.ring("198.18.1.2:51820")
    assert reconciler.stats.rings == 2 and reconciler.stats.rings_dropped == 1
    assert set(reconciler.handshakes.rung) == {key(2)}
    await reconciler.check_handshakes()
    assert device_.handshakes[-1:] == [key(2)]
    await trio.sleep(RING_REPEAT)
    reconciler.ring("198.18.1.2:51820")  # a retry a second later is taken (and started)
    assert reconciler.stats.rings_dropped == 1


async def test_a_known_peers_ring_is_answered_during_a_flood(autojump_clock):
    reconciler, _, _ = lazy_reconciler(range(4))
    await reconciler.reconcile_once()
    for port in range(MAX_BELLS + 10):  # from endpoints no peer has: the book is full
        reconciler.ring(f"198.18.9.9:{port}")
    reconciler.ring("198.18.1.2:51820")  # rank 2, lazy with 0, which initiates
    assert set(reconciler.handshakes.rung) == {key(2)}
    assert reconciler.stats.rings_dropped == 10


async def test_a_ring_is_found_by_its_peers_new_endpoint():
    """The lookup follows the applied peers: a peer that moved rings from where it is now."""
    reconciler, _, view = lazy_reconciler(range(4))
    await reconciler.reconcile_once()
    view.members[2] = replace(view.members[2], endpoint="198.18.7.2:51820")
    view.version += 1
    await reconciler.reconcile_once(resync="rank 2 moved")
    reconciler.ring("198.18.1.2:51820")  # where it was
    assert not reconciler.handshakes.rung
    reconciler.ring("198.18.7.2:51820")
    assert set(reconciler.handshakes.rung) == {key(2)}


# --- a ring during a session whose other side restarted --------------------------------------


def test_a_stray_ring_is_answered_once_its_peer_is_re_added_within_stray_memory():
    """The responder's WireGuard restarted: its first packet rings while we still hold the
    old session (a stray), and its new device id reaches us after; the re-add that follows
    answers that ring at once instead of at the responder's retry 5 s later."""
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    assert not watch.check(device(last=4990.0), 100.0, wall=5000.0).plan  # a live session
    readded = Plan(remove=(ringer(),), add=(ringer(),))  # lazy: no handshake of its own
    watch.note(readded, {key(2): ringer()}, 100.0 + STRAY_MEMORY - 0.1)
    assert set(watch.rung) == {key(2)}
    found = watch.check(device(), 100.0 + STRAY_MEMORY, wall=5005.0)
    assert found.plan.handshake == (key(2),) and found.answered == [ringer()]


def test_a_stray_ring_is_forgotten_after_stray_memory():
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    watch.check(device(last=4990.0), 100.0, wall=5000.0)
    watch.note(Plan(remove=(ringer(),), add=(ringer(),)), {key(2): ringer()}, 100.0 + STRAY_MEMORY)
    assert not watch.rung
    watch.ring(ringer(), 200.0)
    watch.check(device(last=4990.0), 200.0, wall=5000.0)
    watch.check(device(last=4990.0), 200.0 + STRAY_MEMORY, wall=5005.0)  # pruned by a check
    assert not watch.strays


def test_a_ring_that_crosses_a_starting_session_is_not_remembered():
    """Both sides sent at once: the responder's ring comes as our session starts. A re-add
    soon after (its WireGuard restarted) must not start a handshake nobody asked for."""
    watch = HandshakeWatch()
    watch.ring(ringer(), 100.0)
    assert not watch.check(device(last=4999.9), 100.0, wall=5000.0).plan
    assert not watch.strays
    watch.note(Plan(remove=(ringer(),), add=(ringer(),)), {key(2): ringer()}, 101.0)
    assert not watch.rung


def test_the_spacing_of_reads_is_capped_whatever_the_devices_size():
    watch = HandshakeWatch()
    watch.read_took(1_000_000)
    assert watch.read_spacing == MAX_READ_SPACING
