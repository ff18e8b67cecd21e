"""The doctor's wire codec and report (``vnetd.doctor.evidence``, ``vnetd.doctor.report``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vnetd.commands.doctor.gather import failed_pairs, merge_passes
from vnetd.doctor.cause import NO_HANDSHAKE, OVERLOADED, Verdict
from vnetd.doctor.evidence import (
    PeerSeen,
    Row,
    RowRequest,
    WireError,
    decode_request,
    decode_row,
    encode_request,
    encode_row,
    merge_rows,
)
from vnetd.doctor.report import Run, document, text
from vnetd.model import Member


def test_a_row_survives_the_wire() -> None:
    row = Row(3, "pod3", "k" * 44, 1420, {
        1: PeerSeen(1, "a" * 44, "198.18.0.2:51820", 4.5, 10, 20, 0.001, None, 1300, 96,
                    lag=1.25, echoed=3, written=8904, sent=92),
        2: PeerSeen(2),
    })  # fmt: skip
    assert decode_row(encode_row(row)) == row


def test_a_row_of_a_daemon_without_write_counts_decodes_with_none_written() -> None:
    """``written`` and ``sent`` are optional on the wire: a row from an older daemon
    decodes (0, no outbound evidence), and an older doctor ignores them."""
    line = (b'{"v":1,"rank":3,"instance":"pod3","public_key":"k","mtu":1420,'
            b'"peers":[{"rank":1,"key":"a","delivered":96,"echoed":3}]}')  # fmt: skip
    seen = decode_row(line).peers[1]
    assert (seen.written, seen.sent, seen.delivered, seen.echoed) == (0, 0, 96, 3)


def test_a_request_survives_the_wire_and_bad_ones_are_refused() -> None:
    request = RowRequest((0, 1, 5), 8.0)
    assert decode_request(encode_request(request), 8) == request
    with pytest.raises(WireError):
        decode_request(encode_request(RowRequest((9,), 8.0)), 8)
    with pytest.raises(WireError):
        decode_request(b'{"v": 1, "ranks": [1], "deadline": 9999}', 8)
    with pytest.raises(WireError):
        decode_request(b"GET / HTTP/1.1", 8)
    with pytest.raises(WireError):
        decode_row(b'{"v": 2}')


def verdicts(size: int, bad: set[tuple[int, int]]) -> tuple[Verdict, ...]:
    return tuple(
        Verdict(a, b, NO_HANDSHAKE, "why") if (a, b) in bad else Verdict(a, b, "ok", rtt=0.001,
                                                                         path_mtu=1420)
        for a in range(size) for b in range(size) if a != b
    )  # fmt: skip


def test_the_text_draws_the_matrix_and_lists_each_failing_pair() -> None:
    run = Run("m", 3, (0, 1, 2), (0, 1, 2), verdicts(3, {(0, 2)}), 1.0)
    out = text(run)
    assert "    0  #." in out
    assert "0 → 2    no_handshake: why" in out
    assert out.endswith("1 of 6 ordered pairs fail\n")


def test_a_pair_not_judged_is_drawn_and_counted_apart() -> None:
    judged = verdicts(3, {(0, 2)})
    unjudged = tuple(replace(v, cause=OVERLOADED) if (v.source, v.target) == (1, 0) else v
                     for v in judged)  # fmt: skip
    out = text(Run("m", 3, (0, 1, 2), (0, 1, 2), unjudged, 1.0))
    assert "    0  #." in out and "    1 ? #" in out
    assert out.endswith("2 of 6 ordered pairs fail (1 not judged: overloaded daemons, run again)\n")


def test_beyond_64_ranks_the_text_summarises() -> None:
    bad = {(0, b) for b in range(1, 70)}
    out = text(Run("m", 70, tuple(range(70)), tuple(range(70)), verdicts(70, bad), 1.0))
    assert "reach matrix" not in out
    assert "rank 0: fails to reach 69, not reached by 0" in out
    assert "no_handshake: 69 pairs, e.g. 0 → 1: why" in out


def test_the_json_document_is_stable() -> None:
    run = Run("m", 3, (0, 1, 2), (0, 1), verdicts(3, {(0, 2)}), 1.0, ("a note",))
    doc = json.loads(json.dumps(document(run)))
    assert doc["schema"] == "vnetd-doctor/1"
    assert doc["ok"] is False
    assert doc["causes"] == {"no_handshake": 1}
    assert doc["failing"] == [
        {"from": 0, "to": 2, "cause": "no_handshake", "detail": "why", "via": None, "largest": None}
    ]
    assert doc["working"][0] == [0, 1, None, 1.0, 1420]
    assert sorted(doc) == sorted(["schema", "mesh", "size", "ok", "elapsed_s", "registered",
                                  "answered", "causes", "failing", "working", "notes"])  # fmt: skip


def test_a_second_pass_keeps_what_passed_further() -> None:
    lost = PeerSeen(1, "k", None, None, 0, 0, None, None, None, 0)
    small = PeerSeen(1, "k", None, 3.0, 0, 0, 0.001, None, 1300, 200)
    full = PeerSeen(1, "k", None, 3.0, 0, 0, 0.001, 0.002, 1420, 200)
    first = Row(0, "pod0", "key", 1420, {1: small, 2: lost})
    merged = merge_rows(first, Row(0, "pod0", "key", 1420, {1: lost, 2: full}))
    assert merged.peers == {1: small, 2: full}
    assert merge_rows(first, None) == first


def test_a_row_that_came_only_in_the_second_pass_is_kept() -> None:
    """A rank asked again because its first row did not come: its late row counts (it
    was dropped, and its pairs named no_answer, however well they passed)."""
    passed = PeerSeen(0, "k0", None, 3.0, 0, 0, 0.001, 0.002, 1420, 200)
    first = {0: Row(0, "pod0", "k0", 1420, {1: PeerSeen(1)})}
    late = Row(1, "pod1", "k1", 1420, {0: passed})
    merged = merge_passes(first, {1: late})
    assert merged == {0: first[0], 1: late}


def test_the_second_pass_asks_again_for_failed_pairs_and_for_rows_that_did_not_come() -> None:
    members = {r: Member(r, f"k{r}", f"198.18.0.{r}:51820", f"pod{r}") for r in range(3)}
    passed = PeerSeen(1, small_rtt=0.001, full_rtt=0.001)
    rows = {0: Row(0, "pod0", "k0", 1420, {1: passed, 2: PeerSeen(2)})}
    asks = {rank: (0, 1, 2) for rank in range(3)}
    assert failed_pairs(rows, members, asks) == {0: (2,), 1: (0, 1, 2), 2: (0, 1, 2)}
