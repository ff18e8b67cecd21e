"""The reconciler names a flapping rank's first changes, counts the rest, and says how many;
a handshake check names a few peers and groups many."""

from __future__ import annotations

import logging

import pytest
from shared import wide_key as key

from vnetd.daemon.plan_log import (
    FLAP_NAMED,
    FLAP_WINDOW,
    NAMED_PER_PASS,
    STEADY,
    FlapLimit,
    log_checked,
)
from vnetd.mesh.initiator import Checked
from vnetd.model import Peer


def test_a_flapping_rank_is_counted_then_summarised(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "vnetd.reconcile")
    flaps = FlapLimit()
    named = [flaps.named(2, 0.1 * i) for i in range(FLAP_NAMED + 30)]
    assert named == [True] * FLAP_NAMED + [False] * 30
    assert flaps.named(3, 1.0), "another rank is named"
    last = 0.1 * (FLAP_NAMED + 29)
    assert flaps.next_summary() == pytest.approx(last + STEADY)
    flaps.flush(last + STEADY - 0.1)
    assert "not logged" not in caplog.text
    flaps.flush(last + STEADY)
    assert "30 joins and leaves of rank 2 not logged" in caplog.text
    assert caplog.text.count("counting its joins and leaves") == 1
    assert flaps.next_summary() == float("inf")


def test_a_new_window_names_again_and_forgets_old_ranks() -> None:
    flaps = FlapLimit()
    for i in range(FLAP_NAMED + 1):
        flaps.named(2, float(i))
    flaps.flush(FLAP_NAMED + STEADY)
    assert not flaps.named(2, FLAP_NAMED + STEADY + 1), "the same window: still counted"
    flaps.flush(FLAP_WINDOW + 20)
    assert flaps.named(2, FLAP_WINDOW + 20), "a new window names it again"
    for rank in range(100):
        flaps.named(100 + rank, FLAP_WINDOW + 21)
    flaps.flush(3 * FLAP_WINDOW)
    assert flaps._windows == {}


def checked_peer(rank: int) -> Peer:
    return Peer(key(rank), (f"10.250.0.{rank + 1}/32",), rank=rank)


def test_a_handshake_check_names_a_few_peers_and_groups_many(caplog):
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    few = [checked_peer(r) for r in range(1, 1 + NAMED_PER_PASS)]
    log_checked(Checked(fallbacks=few, given_up=[checked_peer(9)]))
    assert len(caplog.records) == NAMED_PER_PASS + 1
    assert "peer rank 8: its handshake did not come within 2.0 s" in caplog.text
    assert "peer rank 9: still no handshake after 4 tries; leaving it to" in caplog.text
    caplog.clear()
    many = [checked_peer(r) for r in range(1, 1023)]
    log_checked(Checked(retried=[(p, 2, 1.0) for p in many], fallbacks=many, given_up=many))
    assert [r.getMessage() for r in caplog.records] == [
        "peer ranks 1-1022 (1022): no handshake after starting one; re-added them and "
        "started others",
        "peer ranks 1-1022 (1022): their handshakes did not come within 2.0 s; wrote their "
        "endpoints, so this side starts one when it has something to send",
        "peer ranks 1-1022: still no handshake after 4 tries; leaving them to WireGuard's "
        "own retry",
    ]
