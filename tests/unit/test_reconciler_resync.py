"""The reconciler after the device was rebuilt (wireguard-go restarted) or adopted.

FakeDataplane, virtual time. A restart empties the device; ``request_resync``
must put every peer back at once, not at the next periodic resync. A device
adopted from a killed daemon keeps its peers, and must not be touched before
the members have been listed.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from ipaddress import ip_interface, ip_network
from pathlib import Path

import trio
import trio.testing
from shared import SPEC, FlakyFake, daemon_settings, key

from vnetd.config import Settings
from vnetd.control.membership import encode_member, member_key
from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import Reconciler
from vnetd.daemon.root import run_daemon
from vnetd.daemon.running import Running
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.model import DevicePeer, Member
from vnetd.registry.base import KeyValue, Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec

CONFIG = DeviceConfig(
    "vnet0", base64.b64encode(b"\x09" * 32).decode(), 51820,
    ip_interface("10.250.0.1/16"), ip_network("10.250.0.0/16"), 1420,
)  # fmt: skip


def member(rank: int) -> Member:
    return Member(rank, key(rank), f"198.18.1.{rank}:51820", f"pod{rank}")


def listed(view: MemberView, ranks: range) -> None:
    """Give ``view`` a full list of ``ranks``, as ``sync_members`` does."""
    kvs = [KeyValue(member_key(SPEC, r), encode_member(member(r)), r + 1, r + 1, 1) for r in ranks]
    view.replace(SPEC, kvs)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> float:
    """Wait (virtual time) for ``condition``; returns how long it took."""
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.001)
    return trio.current_time() - start


@asynccontextmanager
async def reconciling(device: FakeDataplane, view: MemberView) -> AsyncIterator[Reconciler]:
    reconciler = Reconciler(SPEC, 0, key(0), view, device, resync_interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        yield reconciler
        nursery.cancel_scope.cancel()


async def test_resync_puts_every_peer_back_at_once(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    device, view = FakeDataplane(CONFIG), MemberView()
    listed(view, range(4))
    async with reconciling(device, view) as reconciler:
        await until(lambda: len(device.device) == 3)
        caplog.clear()
        device.close()  # wireguard-go died: a new device has no peers and no routes
        before = len(device.applied)
        reconciler.request_resync("wireguard-go restart")
        took = await until(lambda: len(device.device) == 3)

        assert took < 0.01, "not left for the periodic resync"
        (plan,) = device.applied[before:]
        assert [(p.public_key, p.endpoint) for p in plan.add] == [
            (key(r), f"198.18.1.{r}:51820") for r in (1, 2, 3)
        ]
        assert await device.routes() == {"10.250.0.2/32", "10.250.0.3/32", "10.250.0.4/32"}
        assert reconciler.stats.resyncs == 1
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            "after wireguard-go restart: re-applied 3 peer(s) (3 added, 0 updated, 0 removed) in"
        )


async def test_resync_of_an_intact_device_rewrites_nothing(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    device, view = FakeDataplane(CONFIG), MemberView()
    listed(view, range(4))
    async with reconciling(device, view) as reconciler:
        await until(lambda: len(device.device) == 3)
        # Rank 2 roamed behind a NAT: the device knows better than the registry.
        roamed = replace(device.device[key(2)], endpoint="203.0.113.7:40000")
        device.device[key(2)] = roamed
        before = len(device.applied)
        reconciler.request_resync("wireguard-go restart")
        await until(lambda: reconciler.stats.resyncs == 1)
        assert device.applied[before:] == []
        assert device.device[key(2)] == roamed
        assert "after wireguard-go restart: the device already holds all 3 peer(s)" in caplog.text


async def test_failed_resync_is_retried_and_still_reported(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    device, view = FlakyFake(CONFIG), MemberView()
    listed(view, range(4))
    async with reconciling(device, view) as reconciler:
        await until(lambda: len(device.device) == 3)
        device.close()
        device.failures = 2
        reconciler.request_resync("wireguard-go restart")
        took = await until(lambda: len(device.device) == 3)
        assert took < 1.0  # the reconciler's back-off: 0.1 s, then 0.2 s
        assert caplog.text.count("applying the plan failed") == 2
        assert "after wireguard-go restart: re-applied 3 peer(s)" in caplog.text
        assert "peer joined" not in caplog.text.split("plan failed")[-1]


async def test_requests_before_a_pass_are_merged(autojump_clock) -> None:
    device, view = FakeDataplane(CONFIG), MemberView()
    listed(view, range(4))
    async with reconciling(device, view) as reconciler:
        await until(lambda: len(device.device) == 3)
        device.close()
        reconciler.request_resync("first")
        reconciler.request_resync("second")
        await until(lambda: len(device.device) == 3)
        await trio.sleep(5)
        assert reconciler.stats.resyncs == 1


async def test_an_unlisted_view_leaves_an_adopted_device_alone(autojump_clock) -> None:
    device, view = FakeDataplane(CONFIG), MemberView()
    kept = {
        key(r): DevicePeer(key(r), (f"10.250.0.{r + 1}/32",), f"198.18.1.{r}:51820") for r in (1, 2)
    }
    device.device = dict(kept)
    async with reconciling(device, view) as reconciler:
        # The registry is slow or down: the empty view is not an empty mesh.
        await trio.sleep(120)
        reconciler.request_resync("wireguard-go restart")
        await trio.sleep(1)
        assert device.applied == []
        assert device.device == kept
        # The first list: only rank 3, which is new, is written.
        listed(view, range(4))
        await until(lambda: len(device.device) == 3)
        (plan,) = device.applied
        assert [p.public_key for p in plan.add] == [key(3)]
        assert (plan.remove, plan.update) == ((), ())


# --- the daemon wires the data plane's restarts to the reconciler --------------------------


class RestartingFake(FakeDataplane):
    """A fake whose device can be rebuilt empty, announcing it like ``UapiDataplane``."""

    def __init__(self, config: DeviceConfig) -> None:
        super().__init__(config)
        self.on_restart: Callable[[str], None] | None = None

    def restart(self) -> None:
        self.close()
        assert self.on_restart is not None, "the daemon did not wire on_restart"
        self.on_restart("wireguard-go restart")


async def test_daemon_reapplies_the_peers_when_the_device_restarts(
    tmp_path: Path, autojump_clock
) -> None:
    registry = MemoryRegistry()
    config = tmp_path / "mesh.toml"
    config.write_text(
        '[mesh]\nname = "unit"\nsize = 4\nnetwork = "10.250.0.0/16"\n[registry]\nlease_ttl = 6\n'
    )
    devices: dict[int, RestartingFake] = {}

    @asynccontextmanager
    async def open_registry(spec: MeshSpec) -> AsyncIterator[Registry]:
        yield registry

    def open_dataplane(rank: int) -> Callable[[DeviceConfig], AsyncIterator[RestartingFake]]:
        @asynccontextmanager
        async def dataplane(device_config: DeviceConfig) -> AsyncIterator[RestartingFake]:
            devices[rank] = RestartingFake(device_config)
            yield devices[rank]

        return dataplane  # type: ignore[return-value]

    async def daemon(rank: int, task_status: trio.TaskStatus[Running]) -> None:
        opts = Settings(spec=load_spec(config), rank=str(rank), state_dir=tmp_path / f"pod{rank}")
        await run_daemon(
            daemon_settings(opts, {"POD_IP": f"198.18.1.{rank}", "POD_NAME": f"pod{rank}"}),
            open_dataplane=open_dataplane(rank),  # type: ignore[arg-type]
            open_registry=open_registry,
            task_status=task_status,
        )

    async with trio.open_nursery() as nursery:
        for rank in range(3):
            await nursery.start(daemon, rank)
        await until(lambda: all(len(d.device) == 2 for d in devices.values()), timeout=30)
        others = {r: dict(devices[r].device) for r in (1, 2)}
        applied = {r: len(devices[r].applied) for r in (1, 2)}

        devices[0].restart()
        took = await until(lambda: len(devices[0].device) == 2)
        assert took < 0.01
        assert await devices[0].routes() == {"10.250.0.2/32", "10.250.0.3/32"}
        # Nobody else noticed.
        assert {r: dict(devices[r].device) for r in (1, 2)} == others
        assert {r: len(devices[r].applied) for r in (1, 2)} == applied
        nursery.cancel_scope.cancel()
