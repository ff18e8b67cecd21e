"""A keepalive that gets no answer is tried again soon, so a short outage keeps the lease.

``ClaimHolder`` on a ``MemoryRegistry`` (whose leases end at their deadline, as
etcd's do) with a 6 s TTL: renewals every 2 s. The registry refuses every call
for 2.6 s, from just before the first renewal: the renewals at 2 s and 4 s
fail. Renewing a whole interval after each failure would next try at 6 s,
when the lease has ended; retrying within a second renews it in time.
A keepalive that times out after longer than the interval is tried again at
once. A large mesh at rest renews less often, by half its TTL at the latest, and
still rides out an outage of nearly that long. Virtual time.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from shared import byte_key as key
from shared import wide_key

from vnetd.control import retry
from vnetd.control.claim import ClaimHolder
from vnetd.control.membership import encode_member, member_key
from vnetd.control.renewal import KEEPALIVE_RETRY, renewal_interval
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, parse_spec

TTL = 6
ME = Member(1, key(1), "198.18.1.1:51820", "pod1", 100.0, "1.0")


def spec_with(ttl: int, size: int = 4) -> MeshSpec:
    return parse_spec({"mesh": {"name": "m", "size": size, "network": "10.250.0.0/16"},
                       "registry": {"lease_ttl": ttl}})  # fmt: skip


SPEC = spec_with(TTL)


class Keepalives(MemoryRegistry):
    """Records when each keepalive was sent, answered or refused; with ``hang`` set,
    the first hangs that long and then fails (a timeout)."""

    def __init__(self, hang: float | None = None) -> None:
        super().__init__()
        self.hang = hang
        self.sent: list[float] = []

    @property
    def keepalives(self) -> int:
        return len(self.sent)

    async def keepalive(self, lease: int) -> int:
        self.sent.append(trio.current_time())
        if self.hang is not None and len(self.sent) == 1:
            await trio.sleep(self.hang)
            raise RegistryUnavailable("keepalive timed out")
        return await super().keepalive(lease)


@asynccontextmanager
async def holding(registry: MemoryRegistry, spec: MeshSpec = SPEC) -> AsyncIterator[ClaimHolder]:
    """Rank 1's claim, running and claimed; cancelled on exit."""
    claim = ClaimHolder(registry, spec, ME, RegistryHealth())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        yield claim
        nursery.cancel_scope.cancel()


async def test_a_short_outage_over_two_renewals_keeps_the_lease(autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    registry = Keepalives()
    async with holding(registry) as claim:
        lease, start = claim.lease, trio.current_time()
        await trio.sleep_until(start + TTL / 3 - 0.1)
        registry.fail()
        await trio.sleep(2.6)  # the renewals at 2 s and 4 s get no answer
        registry.fail(False)
        refused = registry.keepalives
        await trio.sleep(3 * TTL)
    assert refused >= 3, f"{refused} keepalives during the outage: retried, not waited out"
    assert claim.claims == 1, "the lease ended and the rank was claimed again"
    assert claim.lease == lease
    assert "claiming rank 1 again" not in caplog.text
    assert "registry reachable again" in caplog.text


async def test_a_healthy_registry_gets_one_keepalive_per_third_of_the_ttl(autojump_clock):
    registry = Keepalives()
    async with holding(registry):
        await trio.sleep(10 * TTL + 0.1)
    assert registry.keepalives == 30


async def test_a_keepalive_that_timed_out_after_an_interval_is_retried_at_once(autojump_clock):
    registry = Keepalives(hang=2.5)
    async with holding(registry) as claim:
        await trio.sleep(TTL)
    first, second = registry.sent[:2]
    assert second - first == pytest.approx(registry.hang), "retried at once, not a delay later"
    assert claim.claims == 1


@pytest.mark.parametrize("ttl", [2, 3, 6, 60])
async def test_retries_stay_within_a_sixth_of_the_ttl(autojump_clock, ttl):
    """Refused for a whole TTL from the first renewal: every gap between tries is at
    most TTL/6 once the backoff has grown (and at most KEEPALIVE_RETRY before)."""
    registry = Keepalives(hang=0.0)
    async with holding(registry, spec_with(ttl)):
        await trio.sleep(ttl / 3 - 0.01)
        registry.fail()
        await trio.sleep(ttl * 0.9)
        registry.fail(False)
    tries = registry.sent  # the first fails at once, the registry refuses the rest
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert len(gaps) >= 3, "retried during the outage"
    assert max(gaps) <= ttl / 6 + 1e-9
    assert gaps[0] <= min(KEEPALIVE_RETRY, ttl / 6) + 1e-9


@pytest.mark.parametrize(
    ("ttl", "members", "interval"),
    [
        pytest.param(6, 4, 2.0, id="small-mesh-a-third"),
        pytest.param(60, 640, 20.0, id="up-to-the-rate-a-third"),
        pytest.param(60, 800, 25.0, id="spaced-by-the-rate"),
        pytest.param(60, 1024, 30.0, id="at-most-half"),
        pytest.param(10, 1024, 5.0, id="short-ttl-at-most-half"),
    ],
)
def test_renewal_interval(ttl: int, members: int, interval: float) -> None:
    assert renewal_interval(ttl, members) == pytest.approx(interval)


async def test_a_large_mesh_at_rest_renews_at_half_its_ttl_and_rides_out_an_outage(
    autojump_clock, monkeypatch
):
    """1024 members at a 60 s TTL: a renewal every 20 s while members change (our own
    entry reaching the view, a join), every 30 s once none changed since the last
    renewal (34 a second for the mesh at rest, not 51); and an outage from just before
    a 30 s renewal until 3 s before the lease ends still keeps the lease: the retries
    (0.5, 1, 2, 4, 8 s apart, then halfway to the end) close in on the end instead of
    waiting out a sixth of the TTL past it. No jitter, so the tries fall where the rule
    puts them."""
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)
    spec = spec_with(60, size=1024)
    registry = Keepalives()
    others = await registry.grant(3600)

    def member(rank: int) -> Member:
        return Member(rank, wide_key(rank + 2000), f"198.18.{rank // 256}.{rank % 256}:51820",
                      f"pod{rank}", 100.0, "1.0")  # fmt: skip

    for rank in range(2, 1024):
        await registry.create(member_key(spec, rank), encode_member(member(rank)), others)
    view, health = MemberView(), RegistryHealth()
    claim = ClaimHolder(registry, spec, ME, health, view)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, spec, view, health)
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        lease, start = claim.lease, trio.current_time()
        await trio.sleep_until(start + 105)
        await registry.create(member_key(spec, 0), encode_member(member(0)), others)  # a join
        await trio.sleep_until(start + 210 - 0.1)
        renewals = [round(t - start, 3) for t in registry.sent]
        registry.fail()
        await trio.sleep(27)
        registry.fail(False)
        await trio.sleep(2 * 60)
        nursery.cancel_scope.cancel()
    assert renewals == [20.0, 40.0, 70.0, 100.0, 130.0, 150.0, 180.0]
    tries = [round(t - start, 2) for t in registry.sent[7:16]]
    assert tries[:8] == [210.0, 210.5, 211.5, 213.5, 217.5, 225.5, 232.75, 236.38]
    assert claim.claims == 1, "the lease ended during the outage"
    assert claim.lease == lease


class SlowCreate(Keepalives):
    """A claim transaction that takes ``slow`` s to answer (a loaded etcd)."""

    slow = 0.0

    async def create(self, key: str, value: bytes, lease: int = 0):  # noqa: ANN201
        await trio.sleep(self.slow)
        return await super().create(key, value, lease)


async def test_the_first_renewal_counts_from_the_grant_not_the_claim(autojump_clock):
    """A claim that took 4.5 s of a 6 s lease granted just before it is renewed at once
    (its renewal was due 2 s after the grant), not 2 s after the claim: past the end."""
    registry = SlowCreate()
    registry.slow = 4.5
    start = trio.current_time()
    async with holding(registry) as claim:
        lease = claim.lease
        await trio.sleep(3 * TTL)
    assert registry.sent[0] - start == pytest.approx(registry.slow)
    assert claim.claims == 1, "the lease ended right after the claim"
    assert claim.lease == lease
