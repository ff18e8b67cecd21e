"""Re-adding a young peer whose handshake never completed (crossed initiations)."""

from __future__ import annotations

import base64
from dataclasses import replace
from ipaddress import ip_interface, ip_network

import pytest
import trio
import trio.testing

from vnetd.control.watcher import MemberView
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.model import Member
from vnetd.reconciler import NUDGE_AFTER, Reconciler
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}})


def key(n: int) -> str:
    return base64.b64encode(bytes([n + 1]) * 32).decode()


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def setup(self_rank: int) -> tuple[Reconciler, FakeDataplane, MemberView]:
    config = DeviceConfig(
        "vnet0", key(9), 51820, ip_interface("10.250.0.1/16"), ip_network("10.250.0.0/16"), 1420
    )
    device = FakeDataplane(config)
    view = MemberView()
    view.members = {r: Member(r, key(r), f"198.18.1.{r}:51820", f"pod{r}") for r in range(4)}
    view.version = 1
    return Reconciler(SPEC, self_rank, key(self_rank), view, device), device, view


@pytest.mark.parametrize(
    ("self_rank", "tx", "handshake", "expect_nudged"),
    [
        pytest.param(0, 148, 0.0, {1, 2, 3}, id="lower-rank-stuck"),
        pytest.param(0, 0, 0.0, set(), id="no-traffic-no-nudge"),
        pytest.param(0, 148, 1234.0, set(), id="handshake-done-never-touched"),
    ],
)
async def test_nudge_readds_only_stuck_peers(
    autojump_clock, self_rank, tx, handshake, expect_nudged
):
    reconciler, device, _ = setup(self_rank)
    await reconciler.reconcile_once()
    for k, p in device.device.items():
        device.device[k] = replace(p, tx_bytes=tx, last_handshake=handshake)
    before = len(device.applied)
    await trio.sleep(NUDGE_AFTER + 0.1)
    await reconciler.nudge_handshakes()
    nudged = device.applied[before:]
    ranks = {reconciler.stats.peer_ranks[p.public_key] for plan in nudged for p in plan.add}
    assert ranks == expect_nudged
    for plan in nudged:  # remove and re-add the same peers in one transaction
        assert [p.public_key for p in plan.remove] == [p.public_key for p in plan.add]
    assert await device.routes() == {"10.250.0.3/32", "10.250.0.4/32", "10.250.0.2/32"} - {
        "10.250.0.1/32"
    }
    # Once per join: a second check does nothing.
    after = len(device.applied)
    await trio.sleep(NUDGE_AFTER * 3)
    await reconciler.nudge_handshakes()
    assert len(device.applied) == after


async def test_higher_rank_waits_twice_as_long(autojump_clock):
    reconciler, device, _ = setup(3)
    await reconciler.reconcile_once()
    for k, p in device.device.items():
        device.device[k] = replace(p, tx_bytes=148)
    before = len(device.applied)
    await trio.sleep(NUDGE_AFTER + 0.1)
    await reconciler.nudge_handshakes()
    assert len(device.applied) == before
    await trio.sleep(NUDGE_AFTER)
    await reconciler.nudge_handshakes()
    assert len(device.applied) == before + 1
