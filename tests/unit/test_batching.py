"""A join storm reaches a daemon in batches; one join into a quiet mesh on the live watch.

``sync_members`` on a ``MemoryRegistry`` (whose watch, like etcd's, gives an
up-to-date watcher each change as it happens and a resumed one everything
since in one batch) feeds a ``Reconciler`` on a ``FakeDataplane``; virtual
time. Counted: reconciler passes, watch streams opened, whole device reads.
Speeds are bench figures (``bench/watch_storm.py``), not asserted here.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from ipaddress import ip_interface, ip_network

import trio
import trio.testing
from shared import create_leased
from shared import wide_key as key

from vnetd.control.membership import encode_member, member_key
from vnetd.control.retry import RegistryHealth
from vnetd.control.storm import FULL_BATCH, PAUSE_MAX, PAUSE_MAX_LARGE, PAUSE_MIN, StormGauge
from vnetd.control.watcher import MemberView, sync_members
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SIZE = 1024
SPEC = parse_spec({"mesh": {"name": "m", "size": SIZE, "network": "10.64.0.0/16"}})
SELF = SIZE - 1
CONFIG = DeviceConfig(
    "vnet0", base64.b64encode(b"\xff" * 32).decode(), 51820,
    ip_interface("10.64.3.255/16"), ip_network("10.64.0.0/16"), 1420,
)  # fmt: skip


def member(rank: int) -> Member:
    return Member(rank, key(rank), f"198.18.{rank // 250}.{rank % 250 + 1}:51820", f"pod{rank}")


class CountingWatches(MemoryRegistry):
    """Counts the watch streams opened."""

    opened = 0

    def watch(self, prefix, start_revision):  # noqa: ANN001, ANN201
        self.opened += 1
        return super().watch(prefix, start_revision)


async def join(registry: MemoryRegistry, rank: int) -> None:
    await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.001)


@asynccontextmanager
async def daemon(registry: MemoryRegistry) -> AsyncIterator[tuple[Reconciler, FakeDataplane]]:
    """The member watch and the reconciler of rank ``SELF``, synced with the registry."""
    view, device = MemberView(), FakeDataplane(CONFIG)
    reconciler = Reconciler(SPEC, SELF, key(SELF), view, device)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await nursery.start(reconciler.run)
        await reconciler.wait_synced()
        yield reconciler, device
        nursery.cancel_scope.cancel()


async def test_a_storm_of_500_joins_reaches_a_daemon_in_few_passes(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="vnetd.watch")
    registry = CountingWatches()
    async with daemon(registry) as (reconciler, device):
        before, opened = reconciler.stats.runs, registry.opened
        for rank in range(500):  # 500 joins in one second, as a big Job's pods register
            await join(registry, rank)
            await trio.sleep(0.002)
        await until(lambda: len(device.device) == 500)
        passes = reconciler.stats.runs - before
        assert passes <= 20, f"{passes} passes for a storm of 500 joins"
        assert registry.opened - opened <= 20
        assert "taking them in batches" in caplog.text
        assert sum(len(plan) for plan in device.applied) == 500, "a join changes one peer"


async def test_one_join_into_a_quiet_mesh_takes_one_pass_on_the_live_watch(autojump_clock):
    registry = CountingWatches()
    for rank in range(64):
        await join(registry, rank)
    async with daemon(registry) as (reconciler, device):
        await until(lambda: len(device.device) == 64)
        await trio.sleep(5)
        before, opened = reconciler.stats.runs, registry.opened
        await join(registry, 100)
        await until(lambda: len(device.device) == 65)
        assert reconciler.stats.runs - before == 1
        assert registry.opened == opened, "the join came on the live watch, not after a pause"


async def test_a_storm_after_a_quiet_spell_is_batched_again_and_ends(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="vnetd.watch")
    registry = CountingWatches()
    async with daemon(registry) as (reconciler, device):
        for storm in range(2):
            for rank in range(storm * 200, storm * 200 + 200):
                await join(registry, rank)
                await trio.sleep(0.005)
            await until(lambda n=storm: len(device.device) == 201 * n + 200)
            await trio.sleep(10)
            before = reconciler.stats.runs
            await join(registry, 900 + storm)  # a single join after the storm: live again
            await until(lambda n=storm: len(device.device) == 201 * (n + 1))
            assert reconciler.stats.runs - before == 1
    assert caplog.text.count("taking them in batches") == 2
    assert caplog.text.count("back to a live watch") == 2


def test_the_gauge_pauses_only_in_a_storm_and_never_after_a_full_batch() -> None:
    gauge = StormGauge()
    assert [gauge.pause_after(t, 1) for t in range(20)] == [0.0] * 20, "one join a second"
    pauses = [gauge.pause_after(100 + i * 0.002, 1) for i in range(10)]
    assert pauses[:7] == [0.0] * 7, "the first joins of a storm come live"
    assert all(PAUSE_MIN <= pause <= PAUSE_MAX for pause in pauses[7:])
    assert gauge.pause_after(101, FULL_BATCH) == 0.0, "etcd has more waiting"


def test_a_large_mesh_batches_a_slower_storm_with_longer_pauses() -> None:
    small, large = StormGauge(), StormGauge()
    joins = [i / 10 for i in range(40)]  # 10 joins a second: below STORM_RATE
    assert [small.pause_after(t, 1, 64) for t in joins] == [0.0] * 40, "64 members: live"
    pauses = [large.pause_after(t, 1, 1024) for t in joins]
    assert pauses[-1] > PAUSE_MAX, "1024 members: 10/s is a storm, paused for more events"
    assert max(pauses) <= PAUSE_MAX_LARGE


class FailingResumes(CountingWatches):
    """The watch opened after ``fail_from`` streams fails, as one that etcd or a
    loaded client did not confirm in time, every ``fail_every``-th time."""

    fail_from = 10**9
    fail_every = 1
    failed = 0

    def watch(self, prefix, start_revision):  # noqa: ANN001, ANN201
        self.opened += 1
        if self.opened > self.fail_from and self.opened % self.fail_every == 0:
            self.failed += 1
            raise RegistryUnavailable("etcd watch failed on every endpoint: no confirmation")
        return MemoryRegistry.watch(self, prefix, start_revision)


async def test_a_storm_resume_that_fails_once_is_resumed_not_listed_again(autojump_clock):
    registry = FailingResumes()
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await until(lambda: view.synced)
        registry.fail_from, registry.fail_every = registry.opened, 2
        for rank in range(300):
            await join(registry, rank)
            await trio.sleep(0.002)
        await until(lambda: len(view.members) == 300)
        assert registry.failed >= 1
        assert view.lists == 1, "a resume that failed once listed the members again"
        nursery.cancel_scope.cancel()
