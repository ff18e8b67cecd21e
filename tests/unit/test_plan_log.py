"""The reconciler names a flapping rank's first changes, counts the rest, and says how many."""

from __future__ import annotations

import logging

import pytest

from vnetd.daemon.plan_log import FLAP_NAMED, FLAP_WINDOW, STEADY, FlapLimit


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
