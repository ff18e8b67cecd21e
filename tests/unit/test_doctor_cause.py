"""``vnetd doctor``'s one cause per ordered pair, table-driven (``vnetd.doctor.cause``).

Each case is a mesh of four ranks (site a: 0-1, site b: 2-3 behind gateway 2
in the gatewayed cases) with one fault in the evidence, and the cause that
fault must get for one pair: the rules' order is what these cases pin down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from shared import wide_key as key

from vnetd.doctor import cause
from vnetd.doctor.cause import Evidence, classify
from vnetd.doctor.evidence import PeerSeen, Row
from vnetd.model import Member
from vnetd.spec import MeshSpec, parse_spec

MESH = {"name": "unit", "size": 4, "network": "10.250.0.0/16"}
FLAT = parse_spec({"mesh": MESH})
SITES = parse_spec({"mesh": MESH, "sites": {"b": {"gateways": [2]}}})
MTU = 1420


def member(rank: int, sites: bool = False) -> Member:
    site = "b" if sites and rank >= 2 else "default"
    return Member(rank, key(rank), f"198.18.0.{rank + 1}:51820", f"pod{rank}", site=site)


def seen(rank: int, **changes: object) -> PeerSeen:
    good = PeerSeen(rank, key(rank), f"198.18.0.{rank + 1}:51820", 5.0, 1000, 1000,
                    0.0004, 0.0005, MTU, 200, echoed=2)  # fmt: skip
    return replace(good, **changes)  # type: ignore[arg-type]


def healthy(spec: MeshSpec = FLAT) -> Evidence:
    sites = bool(spec.gateways)
    members = {r: member(r, sites) for r in range(4)}
    rows = {}
    for r in range(4):
        peers = {}
        for t in range(4):
            if t == r:
                continue
            behind = sites and (t == 3) != (r == 3) and 2 not in (r, t)
            peers[t] = seen(t, key=key(2)) if behind else seen(t)
        rows[r] = Row(r, f"pod{r}", key(r), MTU, peers)
    return Evidence(spec, members, rows)


def with_seen(ev: Evidence, holder: int, peer: int, **changes: object) -> Evidence:
    row = ev.rows[holder]
    peers = dict(row.peers)
    peers[peer] = replace(peers[peer], **changes)  # type: ignore[arg-type]
    return replace(ev, rows={**ev.rows, holder: replace(row, peers=peers)})


def without_row(ev: Evidence, rank: int) -> Evidence:
    return replace(ev, rows={r: row for r, row in ev.rows.items() if r != rank})


def without_member(ev: Evidence, rank: int) -> Evidence:
    ev = without_row(ev, rank)
    return replace(ev, members={r: m for r, m in ev.members.items() if r != rank})


Fault = Callable[[Evidence], Evidence]
NOSPACE = "etcd /v3/lease/grant: etcdserver: mvcc: database space exceeded (HTTP 429, code 8)"


def full(ev: Evidence) -> Evidence:
    """The doctor's own write (a lease grant) was refused for space."""
    return replace(ev, registry_full=NOSPACE)


UDP_DROPPED: Fault = lambda ev: with_seen(  # noqa: E731
    with_seen(without_row(ev, 1), 0, 1, small_rtt=None, full_rtt=None, largest=None,
              handshake_age=None, rx_bytes=0, delivered=0, echoed=0),
    0, 1,
)  # fmt: skip

INNER_DROPPED: Fault = lambda ev: with_seen(  # noqa: E731
    ev, 0, 1, small_rtt=None, full_rtt=None, largest=None, delivered=640, echoed=0
)

LOST: dict[str, object] = {"small_rtt": None, "full_rtt": None, "largest": None}
"""No echo of the pair came back."""


def outbound_dropped(ev: Evidence) -> Evidence:
    """Rank 0's pod drops what it writes to rank 1 before its device: rank 1's echoes reach
    rank 0's service, its answers and rank 0's own echoes never reach rank 0's device;
    rank 1's device got a handshake response (92 B) from rank 0 meanwhile."""
    ev = with_seen(ev, 0, 1, **LOST, delivered=9000, echoed=6, written=8904, sent=92)
    return with_seen(ev, 1, 0, **LOST, delivered=92, echoed=0, written=8904, sent=9600)


def underlay_loss(ev: Evidence) -> Evidence:
    """Both devices sent every echo written (and more), some arrived, none came back."""
    ev = with_seen(ev, 0, 1, **LOST, delivered=0, echoed=0, written=8904, sent=9600)
    return with_seen(ev, 1, 0, **LOST, delivered=0, echoed=3, written=8904, sent=9600)


def dead_holder(ev: Evidence, rank: int = 1, handshake_age: float | None = 40.0) -> Evidence:
    """``rank``'s holder is gone, its entry live (a lease someone else keeps alive): no
    row answers as it, and every prober got no echo and nothing from its key."""
    ev = without_row(ev, rank)
    for prober in ev.rows:
        ev = with_seen(ev, prober, rank, small_rtt=None, full_rtt=None, largest=None,
                       delivered=0, echoed=0, rx_bytes=0, handshake_age=handshake_age)  # fmt: skip
    return ev


def waiting_claimant(ev: Evidence, rank: int = 1) -> Evidence:
    """A new daemon for ``rank`` (another instance, another key) answers at its address."""
    return replace(ev, rows={**ev.rows, rank: Row(rank, f"pod{rank}-new", key(9), MTU, {})})


CASES = [
    pytest.param(FLAT, lambda ev: ev, (0, 1), cause.OK, id="healthy"),
    pytest.param(FLAT, lambda ev: without_member(ev, 1), (0, 1), cause.NOT_REGISTERED,
                 id="never-started-target"),
    pytest.param(FLAT, lambda ev: without_member(ev, 0), (0, 1), cause.NOT_REGISTERED,
                 id="never-started-source"),
    pytest.param(FLAT, lambda ev: full(without_member(ev, 1)), (0, 1), cause.REGISTRY_FULL,
                 id="could-not-claim-target-registry-full"),
    pytest.param(FLAT, lambda ev: full(without_member(ev, 0)), (0, 1), cause.REGISTRY_FULL,
                 id="could-not-claim-source-registry-full"),
    pytest.param(FLAT, lambda ev: full(ev), (0, 1), cause.OK,
                 id="registered-ranks-still-reach-each-other-while-full"),
    pytest.param(FLAT, lambda ev: full(with_seen(ev, 0, 1, full_rtt=None, largest=1300)),
                 (0, 1), cause.MTU_BLACK_HOLE, id="full-names-no-registered-pair"),
    pytest.param(FLAT, dead_holder, (0, 1), cause.HELD_SILENT, id="held-silent-target"),
    pytest.param(FLAT, dead_holder, (1, 0), cause.HELD_SILENT, id="held-silent-source"),
    pytest.param(FLAT, lambda ev: dead_holder(ev, handshake_age=None), (2, 1),
                 cause.HELD_SILENT, id="held-silent-never-shook-hands"),
    pytest.param(FLAT, lambda ev: waiting_claimant(dead_holder(ev)), (0, 1), cause.HELD_SILENT,
                 id="held-silent-before-claimed-twice-when-a-claimant-waits"),
    pytest.param(FLAT, lambda ev: with_seen(dead_holder(ev), 2, 1, delivered=32), (0, 1),
                 cause.LOSSY, id="not-silent-when-one-prober-received-from-the-key"),
    pytest.param(FLAT, lambda ev: with_seen(dead_holder(ev), 3, 1, small_rtt=0.001), (0, 1),
                 cause.LOSSY, id="not-silent-when-one-prober-got-an-echo"),
    pytest.param(FLAT, lambda ev: replace(dead_holder(ev), rows={**dead_holder(ev).rows,
                 1: healthy().rows[1]}), (0, 1), cause.LOSSY,
                 id="not-silent-when-the-holder-answers-the-doctor"),
    pytest.param(FLAT, lambda ev: dead_holder(without_row(without_row(ev, 2), 3)), (0, 1),
                 cause.HELD_SILENT, id="one-prober-is-enough"),
    pytest.param(FLAT, lambda ev: replace(ev, members={**ev.members, 3: replace(
        ev.members[3], public_key=key(1))}), (0, 1), cause.CLAIMED_TWICE, id="key-under-two-ranks"),
    pytest.param(FLAT, lambda ev: replace(ev, rows={**ev.rows, 1: replace(
        ev.rows[1], instance="other-pod")}), (0, 1), cause.CLAIMED_TWICE,
        id="address-answered-by-another-instance"),
    pytest.param(FLAT, lambda ev: replace(ev, rows={**ev.rows, 1: replace(
        ev.rows[1], public_key=key(9))}), (0, 1), cause.KEY_MISMATCH, id="daemon-key-differs"),
    pytest.param(FLAT, lambda ev: with_seen(ev, 0, 1, key=key(9), small_rtt=None),
                 (0, 1), cause.KEY_MISMATCH, id="device-key-differs"),
    pytest.param(FLAT, lambda ev: with_seen(ev, 0, 1, key=None, small_rtt=None),
                 (0, 1), cause.NOT_ON_DEVICE, id="no-peer-on-device"),
    pytest.param(FLAT, UDP_DROPPED, (0, 1), cause.NO_HANDSHAKE, id="udp-dropped-forward"),
    pytest.param(FLAT, UDP_DROPPED, (1, 0), cause.NO_HANDSHAKE, id="udp-dropped-reverse"),
    pytest.param(FLAT, lambda ev: with_seen(with_seen(ev, 0, 1, small_rtt=None, full_rtt=None,
                 largest=None, delivered=0, endpoint="198.18.0.99:51820", handshake_age=400.0),
                 1, 0, small_rtt=None, delivered=0), (0, 1), cause.STALE_ENDPOINT,
                 id="stale-endpoint"),
    pytest.param(FLAT, INNER_DROPPED, (0, 1), cause.NO_DATA, id="inner-dropped"),
    pytest.param(FLAT, lambda ev: with_seen(with_seen(ev, 0, 1, small_rtt=None, full_rtt=None,
                 largest=None, delivered=0), 1, 0, small_rtt=None, delivered=320, echoed=0),
                 (0, 1), cause.NO_DATA, id="inner-dropped-seen-from-the-other-side"),
    pytest.param(FLAT, lambda ev: with_seen(with_seen(ev, 0, 1, small_rtt=None, full_rtt=None,
                 largest=None, delivered=640), 1, 0, small_rtt=None), (0, 1), cause.LOSSY,
                 id="echoes-that-reach-the-service-are-not-dropped-inner-traffic"),
    pytest.param(FLAT, lambda ev: with_seen(ev, 0, 1, small_rtt=None, full_rtt=None,
                 largest=None, delivered=32, echoed=0), (0, 1), cause.LOSSY,
                 id="a-keepalive-is-not-data"),
    pytest.param(FLAT, outbound_dropped, (0, 1), cause.NO_DATA,
                 id="outbound-dropped-in-the-source-pod"),
    pytest.param(FLAT, outbound_dropped, (1, 0), cause.NO_DATA,
                 id="outbound-dropped-in-the-target-pod-its-answers"),
    pytest.param(FLAT, underlay_loss, (0, 1), cause.LOSSY, id="underlay-loss-still-lossy"),
    pytest.param(FLAT, underlay_loss, (1, 0), cause.LOSSY,
                 id="underlay-loss-still-lossy-reverse"),
    pytest.param(FLAT, lambda ev: with_seen(with_seen(outbound_dropped(ev), 0, 1, written=0,
                 sent=0), 1, 0, delivered=32), (0, 1), cause.LOSSY,
                 id="a-row-without-write-counts-is-as-before"),
    pytest.param(FLAT, lambda ev: with_seen(with_seen(outbound_dropped(ev), 0, 1,
                 handshake_age=400.0), 1, 0, delivered=32), (1, 0), cause.LOSSY,
                 id="no-session-no-outbound-evidence"),
    pytest.param(FLAT, lambda ev: with_seen(UDP_DROPPED(ev), 0, 1, written=8904, sent=148),
                 (0, 1), cause.NO_HANDSHAKE, id="writes-without-a-session-are-no-handshake"),
    pytest.param(FLAT, lambda ev: with_seen(INNER_DROPPED(ev), 0, 1, lag=2.5), (0, 1),
                 cause.OVERLOADED, id="a-loss-on-an-overloaded-prober-is-no-evidence"),
    pytest.param(FLAT, lambda ev: with_seen(INNER_DROPPED(ev), 1, 0, lag=2.5), (0, 1),
                 cause.OVERLOADED, id="a-loss-on-an-overloaded-target-is-no-evidence"),
    pytest.param(FLAT, lambda ev: with_seen(ev, 0, 1, full_rtt=None, largest=1300, lag=2.5),
                 (0, 1), cause.OVERLOADED, id="a-large-echo-lost-on-an-overloaded-prober"),
    pytest.param(FLAT, lambda ev: with_seen(UDP_DROPPED(ev), 0, 1, lag=2.5), (0, 1),
                 cause.NO_HANDSHAKE, id="never-a-handshake-is-evidence-under-load-too"),
    pytest.param(FLAT, lambda ev: with_seen(without_row(ev, 1), 0, 1, small_rtt=None,
                 full_rtt=None, largest=None, delivered=296, handshake_age=None), (0, 1),
                 cause.NO_HANDSHAKE, id="initiations-received-are-not-a-session"),
    pytest.param(FLAT, lambda ev: with_seen(ev, 0, 1, full_rtt=None, largest=1300),
                 (0, 1), cause.MTU_BLACK_HOLE, id="black-hole"),
    pytest.param(FLAT, lambda ev: without_row(without_row(ev, 0), 1), (0, 1), cause.NO_ANSWER,
                 id="no-row-either-side"),
    pytest.param(FLAT, lambda ev: without_row(ev, 0), (0, 1), cause.NO_ANSWER,
                 id="source-silent-but-reached"),
    pytest.param(SITES, lambda ev: ev, (0, 3), cause.OK, id="via-gateway-healthy"),
    pytest.param(SITES, lambda ev: with_seen(with_seen(ev, 0, 3, small_rtt=None, full_rtt=None,
                 largest=None), 0, 2, small_rtt=None, full_rtt=None, largest=None),
                 (0, 3), cause.GATEWAY_HOP, id="gateway-first-hop"),
    pytest.param(SITES, lambda ev: with_seen(with_seen(ev, 0, 3, small_rtt=None, full_rtt=None,
                 largest=None), 2, 3, small_rtt=None), (0, 3), cause.GATEWAY_HOP,
                 id="gateway-second-hop"),
    pytest.param(SITES, lambda ev: with_seen(without_member(ev, 2), 0, 3, key=None,
                 small_rtt=None), (0, 3), cause.GATEWAY_HOP, id="gateway-gone"),
    pytest.param(SITES, lambda ev: with_seen(without_row(without_member(ev, 2), 3), 0, 3,
                 key=None, small_rtt=None), (3, 0), cause.GATEWAY_HOP,
                 id="gateway-gone-seen-from-the-far-side"),
    pytest.param(FLAT, lambda ev: with_seen(without_row(ev, 1), 0, 1, key=None,
                 small_rtt=None), (1, 0), cause.NOT_ON_DEVICE, id="not-on-device-way-back"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "fault", "pair", "expected"), CASES)
def test_each_fault_gets_its_one_cause(
    spec: MeshSpec, fault: Fault, pair: tuple[int, int], expected: str
) -> None:
    verdict = classify(fault(healthy(spec)), *pair)
    assert verdict.cause == expected, verdict.detail
    assert verdict.ok == (expected == cause.OK)
    if not verdict.ok:
        assert verdict.detail


def test_a_full_registry_names_nospace_and_the_fix_in_one_line() -> None:
    verdict = classify(full(without_member(healthy(), 3)), 3, 0)
    assert verdict.cause == cause.REGISTRY_FULL
    assert "\n" not in verdict.detail
    for words in ("rank 3 has no entry", "NOSPACE", "compact", "defragment", "alarm"):
        assert words in verdict.detail


def test_a_healthy_mesh_has_no_failing_pair_and_says_how_each_is_reached() -> None:
    ev = healthy(SITES)
    verdicts = [classify(ev, a, b) for a in range(4) for b in range(4) if a != b]
    assert all(v.ok for v in verdicts)
    assert {(v.source, v.target) for v in verdicts if v.via is not None} == {
        (0, 3), (1, 3), (3, 0), (3, 1)
    }  # fmt: skip
    assert all(v.path_mtu == MTU and v.rtt is not None for v in verdicts)


def test_a_black_hole_names_the_largest_size_that_passes() -> None:
    ev = with_seen(healthy(), 0, 1, full_rtt=None, largest=1296)
    verdict = classify(ev, 0, 1)
    assert verdict.path_mtu == 1296
    assert "1296-byte packets pass, 1420-byte ones do not" in verdict.detail


@pytest.mark.parametrize("pair", [(0, 1), (1, 0)])
def test_an_outbound_drop_names_the_pod_it_is_in_and_the_direction(pair: tuple[int, int]) -> None:
    detail = classify(outbound_dropped(healthy()), *pair).detail
    assert "dropped in rank 0's pod, on its way out to vnet0" in detail
    assert "wrote 8904 B of echoes to rank 1" in detail and "sent only 92 B" in detail


def test_no_handshake_names_what_each_device_says() -> None:
    verdict = classify(UDP_DROPPED(healthy()), 0, 1)
    assert "rank 0's device: endpoint 198.18.0.2:51820, last handshake never" in verdict.detail
    assert "rank 1's device: no answer" in verdict.detail
    assert verdict.detail.startswith(
        "UDP blocked: no WireGuard handshake completes between ranks 0 and 1: UDP port 51820 "
        "between their pods is dropped"
    )


def test_no_handshake_with_a_session_up_does_not_blame_udp() -> None:
    ev = with_seen(UDP_DROPPED(healthy()), 0, 1, handshake_age=30.0)
    verdict = classify(ev, 0, 1)
    assert verdict.cause != cause.OK and "UDP blocked" not in verdict.detail


def test_the_gateway_hop_that_fails_is_named() -> None:
    ev = with_seen(healthy(SITES), 0, 3, small_rtt=None, full_rtt=None, largest=None)
    assert "gateway 2 → rank 3 fails" in classify(with_seen(ev, 2, 3, small_rtt=None), 0, 3).detail
    assert "rank 0 → gateway 2 fails" in classify(with_seen(ev, 0, 2, small_rtt=None), 0, 3).detail


def test_held_silent_names_the_entry_and_what_it_cannot_tell_apart() -> None:
    verdict = classify(waiting_claimant(dead_holder(healthy())), 0, 1)
    assert "\n" not in verdict.detail
    for words in ("rank 1's entry (instance 'pod1'", "3 daemons probing its key",
                  "last handshake 40 s ago", "answers as instance 'pod1-new'",
                  "lease kept alive by another client", "partition"):  # fmt: skip
        assert words in verdict.detail
