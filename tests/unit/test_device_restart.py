"""A rank's wireguard-go restarted with the same key: peers drop their stale session.

The member record carries a device id, new at each fresh start of wireguard-go
and kept when a running one is adopted. A peer whose record keeps its key but
changes its device id is removed and added again in one plan (which drops the
session keys of the dead device) and a handshake started with it at once; an
adopted device (same id) is never touched. A wireguard-go restart inside a
running daemon rewrites its entry with the new id, once the peers are back on
the new device. The e2e twin is ``tests/e2e/test_sessions.py``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from ipaddress import ip_interface
from pathlib import Path

import pytest
import trio
import trio.testing
from shared import SPEC, FlakyFake, daemon_settings, key

from vnetd.config import Settings
from vnetd.control.membership import BadEntry, decode_member, encode_member, member_key
from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import Reconciler
from vnetd.daemon.root import run_daemon
from vnetd.daemon.running import Running
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.codec.uapi_protocol import plan_lines
from vnetd.dataplane.fake import FakeDataplane
from vnetd.dataplane.wireguard_go import supervise
from vnetd.dataplane.wireguard_go.device import handshake_lines
from vnetd.mesh.peers import diff
from vnetd.model import DevicePeer, Member, Peer, Plan
from vnetd.registry.base import Registry, WatchEvent
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec


def member(rank: int, device_id: str = "", endpoint: str | None = None) -> Member:
    return Member(
        rank, key(rank), endpoint or f"198.18.1.{rank}:51820", f"pod{rank}", 1.0, "0.1.0", device_id
    )


# --- the record ------------------------------------------------------------------------------


def test_device_id_round_trips_and_an_old_record_without_it_decodes():
    m = member(2, "0123456789abcdef")
    assert decode_member(SPEC, member_key(SPEC, 2), encode_member(m)) == m
    old = {k: v for k, v in json.loads(encode_member(m)).items() if k != "device_id"}
    assert decode_member(SPEC, member_key(SPEC, 2), json.dumps(old).encode()).device_id == ""


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(7, "not a string of at most 64", id="not-a-string"),
        pytest.param("a" * 65, "not a string of at most 64", id="too-long"),
        pytest.param("ab\ncd", "printable ASCII", id="newline"),
        pytest.param("ab cd", "printable ASCII", id="space"),
        pytest.param("é" * 4, "printable ASCII", id="not-ascii"),
    ],
)
def test_a_bad_device_id_is_a_bad_entry_naming_the_field(value, message):
    record = json.loads(encode_member(member(2)))
    record["device_id"] = value
    with pytest.raises(BadEntry, match=f"field device_id .*{message}") as raised:
        decode_member(SPEC, member_key(SPEC, 2), json.dumps(record).encode())
    assert "\n" not in str(raised.value)


# --- the diff --------------------------------------------------------------------------------


def want(rank: int, device_id: str, endpoint: str | None = None) -> Peer:
    return Peer(
        key(rank),
        (f"10.250.0.{rank + 1}/32",),
        endpoint or f"198.18.1.{rank}:51820",
        rank,
        device_id,
    )


def on_device(peer: Peer) -> DevicePeer:
    return DevicePeer(peer.public_key, peer.allowed_ips, peer.endpoint, 1234.0, 100, 100)


@pytest.mark.parametrize(
    ("before", "now", "readded"),
    [
        pytest.param("aaaa", "bbbb", True, id="new-device-id-readds"),
        pytest.param("aaaa", "aaaa", False, id="same-device-id-adopted-untouched"),
        pytest.param("", "bbbb", False, id="first-id-seen-after-an-upgrade-untouched"),
        pytest.param("aaaa", "", False, id="older-daemon-without-id-untouched"),
        pytest.param(None, "bbbb", False, id="never-written-untouched"),
    ],
)
def test_diff_readds_a_peer_whose_device_id_changed(before, now, readded):
    peers = {key(r): want(r, "same") for r in (1, 3)}
    peers[key(2)] = want(2, now)
    actual = {k: on_device(p) for k, p in peers.items()}
    written = {k: p.endpoint for k, p in peers.items()}
    devices = {key(r): "same" for r in (1, 3)}
    if before is not None:
        devices[key(2)] = before
    plan = diff(peers, actual, written, devices)
    if readded:
        assert [p.public_key for p in plan.remove] == [key(2)]
        assert plan.add == (peers[key(2)],)
        assert plan.handshake == (key(2),)
        assert plan.update == ()
    else:
        assert not plan and plan.handshake == ()


def test_a_restarted_peer_that_also_moved_is_readded_at_its_new_endpoint():
    new = want(2, "bbbb", endpoint="198.18.2.2:51820")
    actual = {key(2): on_device(want(2, "aaaa"))}
    plan = diff({key(2): new}, actual, {key(2): "198.18.1.2:51820"}, {key(2): "aaaa"})
    assert plan.add == (new,) and plan.add[0].endpoint == "198.18.2.2:51820"
    assert [p.public_key for p in plan.remove] == [key(2)] and plan.update == ()


@pytest.mark.parametrize("keepalive", [0, 25])
def test_handshake_lines_turn_the_persistent_keepalive_off_on_and_back(keepalive):
    plan = Plan(remove=(want(2, "a"),), add=(want(2, "b"),), handshake=(key(2),))
    hexkey = (bytes([3]) * 32).hex()
    lines = plan_lines(plan, keepalive) + handshake_lines(plan.handshake, keepalive)
    section = [("public_key", hexkey), ("update_only", "true")]
    assert lines[-9:] == [
        *section, ("persistent_keepalive_interval", "0"),
        *section, ("persistent_keepalive_interval", "1"),
        *section, ("persistent_keepalive_interval", str(keepalive)),
    ]  # fmt: skip
    assert lines.index(("remove", "true")) < len(lines) - 9, "after the re-add"


# --- the reconciler --------------------------------------------------------------------------


def device_config(rank: int) -> DeviceConfig:
    return DeviceConfig(
        "vnet0", base64.b64encode(bytes(32)).decode(), 51820,
        ip_interface(f"10.250.0.{rank + 1}/16"), SPEC.network, 1420,
    )  # fmt: skip


def rewrite(view: MemberView, new: Member) -> None:
    """``new`` rewrites its rank's entry (same create revision), as the member watch
    delivers it."""
    created = view.created.get(new.rank, 0)
    event = WatchEvent("put", member_key(SPEC, new.rank), encode_member(new), 0, created, 1)
    view.apply(SPEC, event)


async def test_reconciler_readds_only_the_restarted_peer_and_starts_a_handshake(caplog):
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    view, device = MemberView(), FakeDataplane(device_config(0))
    view.members = {r: member(r, f"dev{r}") for r in range(4)}
    view.created = {r: r + 1 for r in range(4)}  # registered in rank order
    view.version = 1
    view.synced = True
    reconciler = Reconciler(SPEC, 0, key(0), view, device)
    await reconciler.reconcile_once()
    for k, p in device.device.items():  # sessions: handshakes and traffic
        device.device[k] = replace(p, last_handshake=1234.0, rx_bytes=500, tx_bytes=500)
    sessions = dict(device.device)
    caplog.clear()
    device.answers = False  # the session with the new device is not there yet
    started = len(device.handshakes)  # rank 0 started those of the pairs at the joins

    rewrite(view, member(2, "dev2-new"))
    plan = await reconciler.reconcile_once()
    assert [p.public_key for p in plan.remove] == [key(2)] and plan.add[0].public_key == key(2)
    assert device.handshakes[started:] == [key(2)]
    assert device.device[key(2)] == DevicePeer(key(2), ("10.250.0.3/32",), "198.18.1.2:51820")
    assert {k: device.device[k] for k in (key(1), key(3))} == {
        k: sessions[k] for k in (key(1), key(3))
    }, "another peer's session was touched"
    assert await device.routes() == {"10.250.0.2/32", "10.250.0.3/32", "10.250.0.4/32"}
    assert [r.getMessage() for r in caplog.records][:1] == [
        "peer rank 2 restarted its device (device id dev2 -> dev2-new); re-added it "
        "to drop the old session"
    ]
    assert "joined" not in caplog.text and "left" not in caplog.text
    assert reconciler.stats.device_restarts == 1

    # The daemon restarted and adopted its device: a new record, the same device id.
    rewrite(view, replace(member(2, "dev2-new"), started=2.0))
    assert not await reconciler.reconcile_once()
    assert device.handshakes[started:] == [key(2)]


async def test_after_a_resync_runs_once_the_pass_has_applied(autojump_clock):
    view, device = MemberView(), FlakyFake(device_config(0))
    view.members = {r: member(r) for r in range(4)}
    view.version = 1
    view.synced = True
    reconciler = Reconciler(SPEC, 0, key(0), view, device)
    peers_then: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        with trio.fail_after(5):
            while len(device.device) != 3:
                await trio.sleep(0.01)
        device.close()
        device.failures = 2
        reconciler.request_resync(
            "wireguard-go restart", then=lambda: peers_then.append(len(device.device))
        )
        with trio.fail_after(5):
            while not peers_then:
                await trio.sleep(0.01)
        assert peers_then == [3], "called before the peers were back"
        assert reconciler.stats.failures == 2
        nursery.cancel_scope.cancel()


# --- the daemon (MemoryRegistry + FakeDataplane) ---------------------------------------------

CONFIG = '[mesh]\nname = "unit"\nsize = 4\nnetwork = "10.250.0.0/16"\n[registry]\nlease_ttl = 6\n'


class KillableRegistry(MemoryRegistry):
    """``revoke`` can be switched off: a SIGKILLed daemon revokes nothing."""

    revokes = True

    async def revoke(self, lease: int) -> None:
        if self.revokes:
            await super().revoke(lease)


class Daemons:
    def __init__(self, tmp: Path, nursery: trio.Nursery) -> None:
        self.tmp = tmp
        self.nursery = nursery
        self.registry = KillableRegistry()
        self.config = tmp / "mesh.toml"
        self.config.write_text(CONFIG)
        self.devices: dict[int, FakeDataplane] = {}
        self.running: dict[int, Running] = {}
        self.scopes: dict[int, trio.CancelScope] = {}

    @asynccontextmanager
    async def _registry(self, spec: MeshSpec) -> AsyncIterator[Registry]:
        yield self.registry

    async def start(self, rank: int, device_id: str | None = None) -> Running:
        """Rank ``rank``'s daemon on a new fake device, or on one with ``device_id``
        (a running wireguard-go adopted)."""

        @asynccontextmanager
        async def dataplane(config: DeviceConfig) -> AsyncIterator[FakeDataplane]:
            device = FakeDataplane(config)
            if device_id is not None:
                device.device_id = device_id
            self.devices[rank] = device
            yield device

        async def runner(task_status: trio.TaskStatus[Running]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[rank] = scope
                opts = Settings(
                    spec=load_spec(self.config), rank=str(rank), state_dir=self.tmp / f"p{rank}"
                )
                env = {"POD_IP": f"198.18.1.{rank}", "POD_NAME": f"pod{rank}"}
                await run_daemon(
                    daemon_settings(opts, env), open_dataplane=dataplane, open_registry=self._registry,
                    task_status=task_status,
                )  # fmt: skip

        self.running[rank] = await self.nursery.start(runner)
        return self.running[rank]

    async def entry(self, rank: int) -> tuple[Member, int, int]:
        kv = await self.registry.get(member_key(self.running[rank].spec, rank))
        assert kv is not None
        return (
            decode_member(self.running[rank].spec, kv.key, kv.value, kv.lease),
            kv.create_revision,
            kv.lease,
        )

    async def start_mesh(self, size: int = 3) -> None:
        """Ranks 0..size-1, started (so registered) in that order, each holding the others."""
        for rank in range(size):
            await self.start(rank)
        await self.until(lambda: all(len(x.device) == size - 1 for x in self.devices.values()))

    async def until(self, condition: Callable[[], bool], timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while not condition():
                await trio.sleep(0.01)


async def test_wireguard_go_restart_rewrites_the_entry_and_peers_readd(tmp_path, autojump_clock):
    """Rank 2, the last to register, restarts its wireguard-go: ranks 0 and 1 start the
    handshakes of their pairs with it (invariant 10), so they re-add it."""
    async with trio.open_nursery() as nursery:
        d = Daemons(tmp_path, nursery)
        await d.start_mesh()
        entry, created, lease = await d.entry(2)
        assert entry.device_id == d.devices[2].device_id != ""
        applied = {r: len(d.devices[r].applied) for r in (0, 1)}
        started = {r: len(d.devices[r].handshakes) for r in (0, 1)}

        peers_at_update: list[int] = []
        replace_entry = d.registry.replace

        async def spying_replace(k: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
            peers_at_update.append(len(d.devices[2].device))
            return await replace_entry(k, value, mod_revision, lease)

        d.registry.replace = spying_replace  # type: ignore[method-assign]
        old_id = d.devices[2].device_id
        d.devices[2].restart()
        new_id = d.devices[2].device_id
        await d.until(lambda: all(len(d.devices[r].applied) == applied[r] + 1 for r in (0, 1)))
        after, created_after, lease_after = await d.entry(2)
        assert (after.device_id, created_after, lease_after) == (new_id, created, lease)
        assert peers_at_update == [2], "the entry was rewritten before the peers were back"
        claim = d.running[2].claim
        assert (claim.claims, claim.record_updates) == (1, 1)
        for r in (0, 1):
            (plan,) = d.devices[r].applied[applied[r] :]
            assert [p.public_key for p in plan.remove] == [p.public_key for p in plan.add]
            assert plan.handshake == (d.running[2].me.public_key,)
            assert d.devices[r].handshakes[started[r] :] == [d.running[2].me.public_key]
        assert new_id != old_id
        nursery.cancel_scope.cancel()


async def test_first_registration_restarting_its_wireguard_go_starts_the_handshakes(
    tmp_path, autojump_clock, caplog
):
    """Rank 0, the first to register, restarts its wireguard-go: its new device starts a
    handshake with each peer as it adds it back, which replaces their stale sessions;
    ranks 1 and 2 only log the new device id (a re-add would drop the new session)."""
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    async with trio.open_nursery() as nursery:
        d = Daemons(tmp_path, nursery)
        await d.start_mesh()
        applied = {r: len(d.devices[r].applied) for r in (1, 2)}
        old_id = d.devices[0].device_id
        started = len(d.devices[0].handshakes)
        d.devices[0].restart()
        await d.until(lambda: d.running[0].claim.record_updates == 1)
        await trio.sleep(5)
        new_id = d.devices[0].device_id
        assert sorted(d.devices[0].handshakes[started:]) == sorted(
            d.running[r].me.public_key for r in (1, 2)
        ), "the restarted device did not start the handshakes"
        for r in (1, 2):
            assert len(d.devices[r].applied) == applied[r], "a responder re-added rank 0"
        line = (
            f"peer rank 0 restarted its device (device id {old_id} -> {new_id}); its own "
            "handshake replaces the old session"
        )
        assert caplog.text.count(line) == 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("adopted", "readded"),
    [pytest.param(True, False, id="device-adopted"), pytest.param(False, True, id="fresh-device")],
)
async def test_killed_daemon_restarted_in_the_same_pod(tmp_path, autojump_clock, adopted, readded):
    """Rank 2, the last to register, is killed and started again; ranks 0 and 1 start
    the handshakes of their pairs with it (invariant 10)."""
    async with trio.open_nursery() as nursery:
        d = Daemons(tmp_path, nursery)
        await d.start_mesh()
        applied = {r: len(d.devices[r].applied) for r in (0, 1)}
        started = {r: len(d.devices[r].handshakes) for r in (0, 1)}
        old_id = d.devices[2].device_id
        _, created, _ = await d.entry(2)

        old_lease = d.running[2].claim.lease
        d.registry.revokes = False  # SIGKILL: the lease lives on, the entry stays
        d.scopes[2].cancel()
        await trio.sleep(1)
        d.registry.revokes = True

        async def within_the_ttl() -> None:
            # The restart comes within the old lease's TTL (virtual time may jump
            # while the daemon starts up in a thread).
            while True:
                await d.registry.keepalive(old_lease)
                await trio.sleep(1)

        nursery.start_soon(within_the_ttl)
        restarted = await d.start(2, device_id=old_id if adopted else None)
        await d.until(lambda: restarted.claim.claimed_at is not None)
        assert restarted.claim.claims == 1
        await d.registry.revoke(old_lease)
        await trio.sleep(10)  # past the old lease's end
        entry, created_after, _ = await d.entry(2)
        assert entry.device_id == d.devices[2].device_id
        assert created_after == created, "taken over, not deleted and created again"
        for r in (0, 1):
            plans = d.devices[r].applied[applied[r] :]
            assert len(plans) == (1 if readded else 0), plans
            assert d.devices[r].handshakes[started[r] :] == (
                [d.running[2].me.public_key] if readded else []
            )
        nursery.cancel_scope.cancel()


async def test_device_id_written_while_the_registry_is_down_is_written_later(
    tmp_path, autojump_clock
):
    async with trio.open_nursery() as nursery:
        d = Daemons(tmp_path, nursery)
        await d.start(0)
        await d.start(1)
        await d.until(lambda: all(len(x.device) == 1 for x in d.devices.values()))
        _, created, lease = await d.entry(0)
        d.registry.fail(True)
        d.devices[0].restart()
        await trio.sleep(1.5)  # less than a lease TTL (6 s)
        d.registry.fail(False)
        await d.until(lambda: d.running[0].claim.record_updates == 1, timeout=5)
        entry, created_after, lease_after = await d.entry(0)
        assert (entry.device_id, created_after, lease_after) == (
            d.devices[0].device_id,
            created,
            lease,
        )
        assert d.running[0].claim.claims == 1
        nursery.cancel_scope.cancel()


# --- the id file next to wireguard-go's socket -------------------------------------------------


def test_device_id_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "SOCKET_DIR", str(tmp_path))
    assert supervise.read_device_id("vnet0") is None
    first = supervise.write_device_id("vnet0")
    assert supervise.read_device_id("vnet0") == first
    assert (tmp_path / "vnet0.id").read_text() == first + "\n"
    assert supervise.write_device_id("vnet0") != first
    (tmp_path / "vnet0.id").write_text("not an id\n")
    assert supervise.read_device_id("vnet0") is None
