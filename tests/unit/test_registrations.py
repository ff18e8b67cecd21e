"""A public key belongs to its earliest registration (issue 8; issue 4's garbage case).

A valid entry carrying a key that another rank registered first is skipped,
whether its rank is lower or higher: a copy of rank 3's key written at a free
``members/0`` used to take rank 3's peer (the lowest rank won) and move it to
rank 0's address. The order is the etcd create revision of each entry, kept
per rank by ``MemberView``. The e2e twin is
``tests/e2e/test_faults_members.py::test_garbage_is_skipped_logged_once_and_touches_no_peer``.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from ipaddress import ip_interface

import pytest
import trio
import trio.testing
from shared import create_leased, key
from test_daemon import Cluster

from vnetd.control.membership import encode_member, member_key
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.mesh.peers import Skipped, desired_peers
from vnetd.model import Member
from vnetd.observe.endpoints import DaemonEndpoints
from vnetd.observe.metrics import DaemonMetrics
from vnetd.registry.base import KeyValue
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 8, "network": "10.250.0.0/16"}})


def member(rank: int, key_of: int | None = None) -> Member:
    """Rank ``rank``'s entry, carrying rank ``key_of``'s public key (its own by default)."""
    return Member(rank, key(rank if key_of is None else key_of), f"198.18.1.{rank}:51820", "p")


def address(rank: int) -> tuple[str, ...]:
    return (f"10.250.0.{rank + 1}/32",)


# (members as (rank, key of), create revisions or None, who holds rank 3's key, skipped)
TABLE = [
    pytest.param(
        [(3, 3), (0, 3)], {3: 10, 0: 20}, 3, [Skipped(0, "public key already registered by rank 3")],
        id="copy-under-a-lower-free-rank-written-later",
    ),
    pytest.param(
        [(3, 3), (6, 3)], {3: 10, 6: 20}, 3, [Skipped(6, "public key already registered by rank 3")],
        id="copy-under-a-higher-free-rank-written-later",
    ),
    pytest.param(
        [(3, 3), (0, 3)], {3: 40, 0: 20}, 0, [Skipped(3, "public key already registered by rank 0")],
        id="member-re-created-after-the-copy-loses-until-the-copy-is-deleted",
    ),
    pytest.param(
        [(3, 3), (0, 3)], {3: -7, 0: 2}, 3, [Skipped(0, "public key already registered by rank 3")],
        id="member-held-after-a-reset-comes-before-the-new-store",
    ),
    pytest.param(
        [(3, 3), (0, 3)], None, 0, [Skipped(3, "public key already registered by rank 0")],
        id="no-revisions-lowest-rank-as-wg-quick-renders",
    ),
    pytest.param(
        [(3, 3), (0, 3)], {3: 10, 0: 10}, 0, [Skipped(3, "public key already registered by rank 0")],
        id="equal-revisions-lowest-rank",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("entries", "created", "holder", "skipped"), TABLE)
def test_a_public_key_belongs_to_its_earliest_registration(entries, created, holder, skipped):
    members = {rank: member(rank, key_of) for rank, key_of in entries}
    members[1] = member(1)
    peers, left_out = desired_peers(members, 1, SPEC, key(1), created)
    assert peers[key(3)].rank == holder
    assert peers[key(3)].allowed_ips == address(holder), "an address is only its rank's"
    assert peers[key(3)].endpoint == members[holder].endpoint
    assert left_out == skipped
    ips = [ip for p in peers.values() for ip in p.allowed_ips]
    assert len(ips) == len(set(ips))


def test_our_own_key_under_an_earlier_entry_is_still_ignored():
    members = {0: member(0, key_of=1), 1: member(1), 2: member(2)}
    peers, skipped = desired_peers(members, 1, SPEC, key(1), {0: 1, 1: 5, 2: 6})
    assert set(peers) == {key(2)}
    assert skipped == [Skipped(0, "registers this rank's own public key")]


# --- the view keeps each member's create revision ------------------------------------------


async def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


async def test_view_keeps_create_revisions_through_takeover_delete_and_list(autojump_clock):
    registry = MemoryRegistry()
    k1, k2 = member_key(SPEC, 1), member_key(SPEC, 2)
    await create_leased(registry, k1, encode_member(member(1)))
    view = MemberView()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await wait_for(lambda: 1 in view.members)
        first = await registry.get(k1)
        assert first is not None and view.created == {1: first.create_revision}

        await create_leased(registry, k2, encode_member(member(2)))
        await wait_for(lambda: 2 in view.members)
        created2 = view.created[2]
        assert created2 > view.created[1]

        # A takeover (compare-and-swap on the entry) keeps its place.
        moved = Member(1, key(1), "198.18.9.1:51820", "p")
        assert await registry.replace(k1, encode_member(moved), first.mod_revision, first.lease)
        await wait_for(lambda: view.members[1] == moved)
        assert view.created[1] == first.create_revision

        # Deleted and created again (its lease ended, then it claimed again): last in line.
        await registry.delete(k1)
        await wait_for(lambda: 1 not in view.members)
        assert 1 not in view.created
        await create_leased(registry, k1, encode_member(member(1)))
        await wait_for(lambda: 1 in view.members)
        assert view.created[1] > created2

        # A fresh list sees the same revisions.
        relisted = view.lists
        registry.fail(True)
        await trio.sleep(5)
        registry.fail(False)
        kvs, _ = await registry.list_prefix("/vnetd/m/members/")
        await wait_for(lambda: view.lists > relisted)
        assert view.created == {int(kv.key.rsplit("/", 1)[1]): kv.create_revision for kv in kvs}
        nursery.cancel_scope.cancel()


def test_members_held_after_a_reset_come_before_the_new_store():
    """The new store's revisions start low again: a copy of a held member's key written
    there must not win over the member, which registered first."""
    view = MemberView()
    old = [
        KeyValue(member_key(SPEC, r), encode_member(member(r)), 900 + r, 900 + r, 1) for r in (1, 3)
    ]
    view.replace(SPEC, old, 1000)
    copy = KeyValue(member_key(SPEC, 0), encode_member(member(0, key_of=3)), 2, 2, 1)
    again = KeyValue(member_key(SPEC, 1), encode_member(member(1)), 3, 3, 1)
    view.replace(SPEC, [copy, again], 3, now=0.0, hold_until=20.0)  # rank 3 is held
    assert set(view.held) == {3}
    assert view.created[3] < view.created[0] < view.created[1]

    peers, skipped = desired_peers(view.members, 1, SPEC, key(1), view.created)
    assert peers[key(3)].rank == 3
    assert skipped == [Skipped(0, "public key already registered by rank 3")]

    # A second reset while rank 3 is still held keeps it first.
    view.replace(SPEC, [], 1, now=1.0, hold_until=21.0)
    assert view.created[3] < view.created[0] < view.created[1] < 1


# --- the reconciler and the daemon ---------------------------------------------------------


def device_config(rank: int) -> DeviceConfig:
    return DeviceConfig(
        "vnet0", base64.b64encode(bytes(32)).decode(), 51820,
        ip_interface(f"{SPEC.address(rank)}/16"), SPEC.network, 1420,
    )  # fmt: skip


async def test_copy_under_a_lower_free_rank_changes_no_device(autojump_clock, caplog):
    """Rank 1's device with ranks 2 and 3; rank 3's key is then written at free rank 0."""
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    registry = MemoryRegistry()
    for rank in (1, 2, 3):
        await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
    view = MemberView()
    device = FakeDataplane(device_config(1))
    reconciler = Reconciler(SPEC, 1, key(1), view, device)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, RegistryHealth())
        await nursery.start(reconciler.run)
        await wait_for(lambda: len(device.device) == 2)
        applied = len(device.applied)

        await create_leased(registry, member_key(SPEC, 0), encode_member(member(0, key_of=3)))
        await wait_for(lambda: 0 in view.members)
        await trio.sleep(60)  # past a periodic resync
        assert len(device.applied) == applied, "the copy changed the device"
        assert device.device[key(3)].allowed_ips == address(3)
        lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert lines == ["member rank 0 skipped: public key already registered by rank 3"]
        assert reconciler.stats.skipped == 1

        # Rank 3's entry is deleted (its lease ended) and created again: now the copy is
        # the earliest registration and holds the key, at rank 0's address...
        await registry.delete(member_key(SPEC, 3))
        await create_leased(registry, member_key(SPEC, 3), encode_member(member(3)))
        await wait_for(lambda: device.device[key(3)].allowed_ips == address(0))
        assert "member rank 3 skipped: public key already registered by rank 0" in caplog.text
        # ... until the copy is deleted: rank 3's peer gets its own address back.
        await registry.delete(member_key(SPEC, 0))
        await wait_for(lambda: device.device[key(3)].allowed_ips == address(3))
        assert reconciler.stats.skipped == 2
        nursery.cancel_scope.cancel()


async def test_skipped_entries_are_counted_in_the_bad_entries_metric(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0 = await cluster.start(0)
        r2 = await cluster.start(2)
        await cluster.wait_full(["pod0", "pod2"], {0, 2})
        spec = r0.spec
        copy = Member(1, r2.me.public_key, "198.18.9.1:51820", "intruder")
        await create_leased(cluster.registry, member_key(spec, 1), encode_member(copy))
        await create_leased(cluster.registry, member_key(spec, 3), b"{garbage")
        await trio.sleep(1)
        assert cluster.peer_ranks("pod0") == {2}
        endpoints = DaemonEndpoints(spec, r0.me, DaemonMetrics())
        endpoints.attach(r0)
        text = (await endpoints.metrics()).decode()
        assert "vnetd_registry_bad_entries_total 2.0" in text  # one invalid, one copy
        nursery.cancel_scope.cancel()
