"""A registry that comes back empty (etcd on a new data dir): whole daemons on fakes.

Nothing removes a peer because the registry lost its data: members missing
from the first list after a reset are held while they re-register, every
daemon claims its rank again within one lease TTL, the spec is stored again,
and a rank that does not come back is dropped after the grace.
"""

from __future__ import annotations

import json
import logging

import pytest
import trio
import trio.testing
from resettable import wipe
from shared import SPEC
from test_daemon import Cluster

from vnetd.control.claim import ClaimHolder
from vnetd.control.membership import encode_member, member_key, members_prefix, spec_key
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView
from vnetd.model import Member
from vnetd.registry.memory import MemoryRegistry

TTL = 6  # test_daemon's spec
NAMES = ["pod0", "pod1", "pod2"]


async def registered(registry: MemoryRegistry, cluster: Cluster) -> set[int]:
    kvs, _ = await registry.list_prefix(members_prefix(cluster.running["pod0"].spec))
    return {int(kv.key.rpartition("/")[2]) for kv in kvs}


async def reset_registry(cluster: Cluster, outage: float = 8.0) -> float:
    """Down for ``outage`` s, then back empty; returns when it came back."""
    cluster.registry.fail(True)
    await trio.sleep(outage)
    wipe(cluster.registry)
    cluster.registry.fail(False)
    return trio.current_time()


async def test_reset_registry_keeps_peers_and_everyone_reregisters(
    tmp_path, autojump_clock, caplog
):
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (0, 1, 2):
            await cluster.start(rank)
        await cluster.wait_full(NAMES, {0, 1, 2})
        # A mesh that has lived a while has seen ranks come and go: its watchers
        # know a revision far above what the re-registrations reach, so each
        # first list after the reset shows it, before, between or after them.
        spec = cluster.running["pod0"].spec
        visitor = Member(3, "B" * 43 + "=", "198.18.1.4:51820", "pod3")
        for _ in range(5):
            await cluster.registry.create(member_key(spec, 3), encode_member(visitor))
            await trio.sleep(1)
            await cluster.registry.delete(member_key(spec, 3))
            await trio.sleep(1)
        peers = {n: dict(cluster.devices[n].device) for n in NAMES}
        applied = {n: len(cluster.devices[n].applied) for n in NAMES}

        back = await reset_registry(cluster)
        with trio.fail_after(TTL):
            while await registered(cluster.registry, cluster) != {0, 1, 2}:
                await trio.sleep(0.05)
        print(f"re-registered {trio.current_time() - back:.2f} s after the registry came back")
        await trio.sleep(4 * TTL)  # past the grace and a resync

        assert {n: dict(cluster.devices[n].device) for n in NAMES} == peers
        assert {n: len(cluster.devices[n].applied) for n in NAMES} == applied, "no plan at all"
        assert all(r.claim.claims == 2 for r in cluster.running.values())
        assert all(r.view.held == {} for r in cluster.running.values())
        stored = await cluster.registry.get(spec_key(cluster.running["pod0"].spec))
        assert stored is not None and stored.value == cluster.running["pod0"].spec.canonical_json()
        assert "the registry had lost the spec; stored it again" in caplog.text
        assert caplog.text.count("registry was reset (revision 15 → ") == 3  # once per daemon
        nursery.cancel_scope.cancel()


async def test_rank_gone_during_the_reset_is_dropped_after_the_grace(
    tmp_path, autojump_clock, caplog
):
    """Held members are kept for two TTLs after the reset is seen, then dropped."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (0, 1, 2):
            await cluster.start(rank)
        await cluster.wait_full(NAMES, {0, 1, 2})
        cluster.registry.fail(True)
        cluster.stop("pod2")  # its revoke fails: the registry is down
        await trio.sleep(8)
        wipe(cluster.registry)
        cluster.registry.fail(False)
        back = trio.current_time()
        await trio.sleep(2 * TTL - 0.1)
        assert all(2 in cluster.peer_ranks(n) for n in ("pod0", "pod1")), "kept for the grace"
        with trio.fail_after(5):  # the grace runs from the first list after the reset
            while any(2 in cluster.peer_ranks(n) for n in ("pod0", "pod1")):
                await trio.sleep(0.05)
        print(f"rank 2 dropped {trio.current_time() - back:.2f} s after the registry came back")
        assert caplog.text.count("rank 2 did not register again after the registry reset") == 2
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        nursery.cancel_scope.cancel()


async def test_different_spec_stored_after_a_reset_is_logged_not_fatal(
    tmp_path, autojump_clock, caplog
):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (0, 1):
            await cluster.start(rank)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        spec = cluster.running["pod0"].spec
        other = json.loads(spec.canonical_json())
        other["mtu"] = 1280
        await reset_registry(cluster)
        await cluster.registry.create(spec_key(spec), json.dumps(other).encode())
        with trio.fail_after(TTL):
            while await registered(cluster.registry, cluster) != {0, 1}:
                await trio.sleep(0.05)
        await trio.sleep(TTL)
        assert "mesh.mtu: registry has 1280, local 1420" in caplog.text
        assert "this daemon keeps running with the spec it checked at start" in caplog.text
        assert all(r.claim.claimed.is_set() for r in cluster.running.values())
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("listed", "held", "gone"),
    [
        pytest.param(True, False, False, id="listed"),
        pytest.param(True, True, True, id="held-after-reset"),
        pytest.param(False, False, True, id="missing"),
    ],
)
async def test_claim_sees_its_entry_gone_when_only_held(listed, held, gone):
    me = Member(0, "A" * 43 + "=", "198.18.1.1:51820", "pod0")
    view = MemberView()
    view.synced = True
    if listed:
        view.members[0] = me
    if held:
        view.held[0] = 100.0
    health = RegistryHealth()
    health.ok()
    claim = ClaimHolder(MemoryRegistry(), SPEC, me, health, view)
    assert claim._entry_gone() is gone
