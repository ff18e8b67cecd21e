"""vnetd.pacing: the periodic requests of a mesh at rest, spaced by its size."""

from __future__ import annotations

import random

from vnetd.control.spec_check import SPEC_READS
from vnetd.control.watcher import WATCH_RESTARTS
from vnetd.pacing import JITTER, period


def test_a_small_mesh_keeps_its_floor_exactly() -> None:
    rng = random.Random(1)
    assert period(20.0, 8, SPEC_READS, rng) == 20.0
    assert period(60.0, int(60 * WATCH_RESTARTS), WATCH_RESTARTS, rng) == 60.0


def test_a_large_mesh_costs_about_the_mesh_rate_whatever_its_size() -> None:
    rng = random.Random(2)
    for members in (1024, 4096):
        waits = [period(20.0, members, SPEC_READS, rng) for _ in range(2000)]
        spaced = members / SPEC_READS
        assert min(waits) >= spaced * (1 - JITTER) and max(waits) <= spaced
        mean = sum(waits) / len(waits)
        rate = members / mean  # requests a second the whole mesh costs etcd
        assert SPEC_READS < rate < SPEC_READS / (1 - JITTER), rate


def test_jitter_never_takes_a_wait_below_its_floor() -> None:
    rng = random.Random(3)
    # Spaced just past the floor: the jittered wait would fall below it.
    assert all(period(60.0, 250, WATCH_RESTARTS, rng) >= 60.0 for _ in range(500))
