"""The etcd-fault run's own parsing: which etcd versions commit a resumed former
leader's lease revocations, and the claim losses read from a daemon's log."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from vnetd.lab.etcd_faults import claim_losses, old_leader_may_revoke


@pytest.mark.parametrize(
    ("version", "revokes"),
    [
        ("3.4.23", True),  # the lab's
        ("3.4.30", True),
        ("3.4.31", False),  # etcd-io/etcd#17465
        ("3.5.12", True),
        ("3.5.13", False),  # etcd-io/etcd#17425
        ("3.5.33", False),  # the manifests'
        ("3.6.0", False),
        ("3.3.27", True),
        ("", True),
        ("weird", True),
    ],
)
def test_which_etcd_commits_a_former_leaders_revocations(version: str, revokes: bool) -> None:
    assert old_leader_may_revoke(version) is revokes


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


LOG = """\
2026-12-04T02:38:14.479 vnetd rank=0 INFO claimed rank 0 as pod0 (created the entry, lease 1, ttl 5 s)
2026-12-04T02:38:44.879 vnetd rank=0 WARNING rank 0's entry changed in the registry; claiming rank 0 again
2026-12-04T02:38:44.936 vnetd rank=0 INFO claimed rank 0 as pod0 (created the entry, lease 2, ttl 5 s)
2026-12-04T02:38:50.000 vnetd rank=0 WARNING lease 2 expired or unknown to the registry; claiming rank 0 again
"""


def test_claim_losses_are_timed_from_the_faults_end_and_a_loss_not_regained_is_nan() -> None:
    ended = _epoch("2026-12-04T02:38:44.800")
    first, second = claim_losses(0, LOG, ended)
    assert first.rank == 0
    assert first.after_end == pytest.approx(0.079, abs=1e-3)
    assert first.regained_after == pytest.approx(0.057, abs=1e-3)
    assert second.after_end == pytest.approx(5.2, abs=1e-3)
    assert math.isnan(second.regained_after)


def test_a_log_with_one_claim_has_no_losses() -> None:
    assert claim_losses(0, LOG.splitlines(keepends=True)[0], 0.0) == []
