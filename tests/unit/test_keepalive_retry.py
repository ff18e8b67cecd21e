"""A keepalive that gets no answer is tried again soon, so a short outage keeps the lease.

``ClaimHolder`` on a ``MemoryRegistry`` (whose leases end at their deadline, as
etcd's do) with a 6 s TTL: renewals every 2 s. The registry refuses every call
for 2.6 s, from just before the first renewal: the renewals at 2 s and 4 s
fail. Renewing a whole interval after each failure would next try at 6 s,
when the lease has ended; retrying within a second renews it in time.
Virtual time.
"""

from __future__ import annotations

import logging

import trio
import trio.testing
from shared import byte_key as key

from vnetd.control.claim import KEEPALIVE_RETRY, ClaimHolder
from vnetd.control.retry import RegistryHealth
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


def test_the_first_retry_comes_well_inside_a_renewal_interval():
    assert KEEPALIVE_RETRY <= TTL / 3 / 2
