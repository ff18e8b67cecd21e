"""A keepalive that gets no answer is tried again soon, so a short outage keeps the lease.

``ClaimHolder`` on a ``MemoryRegistry`` (whose leases end at their deadline, as
etcd's do) with a 6 s TTL: renewals every 2 s. The registry refuses every call
for 2.6 s, from just before the first renewal: the renewals at 2 s and 4 s
fail. Renewing a whole interval after each failure would next try at 6 s,
when the lease has ended; retrying within a second renews it in time.
A keepalive that times out after longer than the interval is tried again at
once. Virtual time.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from shared import byte_key as key

from vnetd.control.claim import KEEPALIVE_RETRY, ClaimHolder
from vnetd.control.retry import RegistryHealth
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

TTL = 6
SPEC = parse_spec(
    {"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}, "registry": {"lease_ttl": TTL}}
)
ME = Member(1, key(1), "198.18.1.1:51820", "pod1", 100.0, "1.0")


class CountingKeepalives(MemoryRegistry):
    """Counts keepalive calls, answered or refused."""

    keepalives = 0

    async def keepalive(self, lease: int) -> int:
        self.keepalives += 1
        return await super().keepalive(lease)


async def test_a_short_outage_over_two_renewals_keeps_the_lease(autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    registry = CountingKeepalives()
    claim = ClaimHolder(registry, SPEC, ME, RegistryHealth())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        lease, start = claim.lease, trio.current_time()
        await trio.sleep_until(start + TTL / 3 - 0.1)
        registry.fail()
        await trio.sleep(2.6)  # the renewals at 2 s and 4 s get no answer
        registry.fail(False)
        refused = registry.keepalives
        await trio.sleep(3 * TTL)
        nursery.cancel_scope.cancel()
    assert refused >= 3, f"{refused} keepalives during the outage: retried, not waited out"
    assert claim.claims == 1, "the lease ended and the rank was claimed again"
    assert claim.lease == lease
    assert "claiming rank 1 again" not in caplog.text
    assert "registry reachable again" in caplog.text


async def test_a_healthy_registry_gets_one_keepalive_per_third_of_the_ttl(autojump_clock):
    registry = CountingKeepalives()
    claim = ClaimHolder(registry, SPEC, ME, RegistryHealth())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        await trio.sleep(10 * TTL + 0.1)
        nursery.cancel_scope.cancel()
    assert registry.keepalives == 30


class SlowFailure(CountingKeepalives):
    """The first keepalive hangs for ``hang`` s, then fails (a timeout); the times of all."""

    hang = 2.5
    sent: list[float]

    async def keepalive(self, lease: int) -> int:
        self.sent = getattr(self, "sent", [])
        self.sent.append(trio.current_time())
        if len(self.sent) == 1:
            await trio.sleep(self.hang)
            raise RegistryUnavailable("keepalive timed out")
        return await super().keepalive(lease)


async def test_a_keepalive_that_timed_out_after_an_interval_is_retried_at_once(autojump_clock):
    registry = SlowFailure()
    claim = ClaimHolder(registry, SPEC, ME, RegistryHealth())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        await trio.sleep(TTL)
        nursery.cancel_scope.cancel()
    first, second = registry.sent[:2]
    assert second - first == pytest.approx(registry.hang), "retried at once, not a delay later"
    assert claim.claims == 1


@pytest.mark.parametrize("ttl", [2, 3, 6, 60])
async def test_retries_stay_within_a_sixth_of_the_ttl(autojump_clock, ttl):
    """Refused for a whole TTL from the first renewal: every gap between tries is at
    most TTL/6 once the backoff has grown (and at most KEEPALIVE_RETRY before)."""
    spec = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"},
                       "registry": {"lease_ttl": ttl}})  # fmt: skip
    registry = SlowFailure()
    registry.hang = 0.0
    claim = ClaimHolder(registry, spec, ME, RegistryHealth())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim.run)
        await claim.claimed.wait()
        await trio.sleep(ttl / 3 - 0.01)
        registry.fail()
        await trio.sleep(ttl * 0.9)
        registry.fail(False)
        nursery.cancel_scope.cancel()
    tries = registry.sent  # the first fails at once, the registry refuses the rest
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert len(gaps) >= 3, "retried during the outage"
    assert max(gaps) <= ttl / 6 + 1e-9
    assert gaps[0] <= min(KEEPALIVE_RETRY, ttl / 6) + 1e-9
