"""The whole daemon in one process: MemoryRegistry + FakeDataplane, virtual time."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from shared import daemon_settings

from vnetd.config import Settings
from vnetd.control.membership import encode_member, member_key
from vnetd.daemon.root import run_daemon
from vnetd.daemon.running import Running
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import SpecMismatch
from vnetd.model import Member
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec

SPEC = """
[mesh]
name = "unit"
size = {size}
network = "10.250.0.0/16"
hostname = "unit-{{rank}}"
[registry]
lease_ttl = 6
"""


class Cluster:
    """Daemons for several ranks sharing one MemoryRegistry."""

    def __init__(self, tmp: Path, nursery: trio.Nursery, size: int = 4) -> None:
        self.tmp = tmp
        self.nursery = nursery
        self.registry = MemoryRegistry()
        self.config = tmp / "mesh.toml"
        self.config.write_text(SPEC.format(size=size))
        self.devices: dict[str, FakeDataplane] = {}
        self.running: dict[str, Running] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.returned: set[str] = set()
        """Daemons whose ``run_daemon`` returned by itself (not cancelled)."""

    @asynccontextmanager
    async def _registry(self, spec: MeshSpec) -> AsyncIterator[Registry]:
        yield self.registry

    async def start(
        self,
        rank: int,
        instance: str | None = None,
        *,
        site: str | None = None,
        public_endpoint: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Running:
        name = instance or f"pod{rank}"
        opts = Settings(
            spec=load_spec(self.config),
            rank=str(rank),
            state_dir=self.tmp / name,
            instance=name,
            resync_interval=30.0,
            site=site,
            public_endpoint=public_endpoint,
        )
        env = {"POD_IP": f"198.18.1.{rank + 1}", **(env or {})}

        @asynccontextmanager
        async def dataplane(config: DeviceConfig) -> AsyncIterator[FakeDataplane]:
            device = FakeDataplane(config)
            self.devices[name] = device
            try:
                yield device
            finally:
                device.close()

        async def runner(task_status: trio.TaskStatus[Running]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[name] = scope
                self.returned.discard(name)
                await run_daemon(
                    daemon_settings(opts, env),
                    open_dataplane=dataplane,
                    open_registry=self._registry,
                    task_status=task_status,
                )
                self.returned.add(name)

        running: Running = await self.nursery.start(runner)
        self.running[name] = running
        return running

    def stop(self, name: str) -> None:
        self.scopes[name].cancel()

    def peer_ranks(self, name: str) -> set[int]:
        device = self.devices[name]
        return {
            int(ip.split(".")[-1].split("/")[0]) - 1
            for peer in device.device.values()
            for ip in peer.allowed_ips
            if ":" not in ip  # a dual-stack peer's /128 names the same rank
        }

    async def wait_full(self, names: list[str], ranks: set[int], timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while any(self.peer_ranks(n) != ranks - {self.running[n].me.rank} for n in names):
                await trio.sleep(0.1)


async def test_any_start_order_forms_full_mesh(tmp_path, autojump_clock):
    order = [2, 0, 3, 1]
    random.Random(7).shuffle(order)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in order:
            await cluster.start(rank)
            await trio.sleep(random.Random(rank).uniform(0, 2))
        await cluster.wait_full([f"pod{r}" for r in order], {0, 1, 2, 3})
        # Each device's routes follow its peers.
        device = cluster.devices["pod0"]
        assert await device.routes() == {"10.250.0.2/32", "10.250.0.3/32", "10.250.0.4/32"}
        nursery.cancel_scope.cancel()


async def test_join_and_leave_change_one_peer_only(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (0, 1, 2):
            await cluster.start(rank)
        await cluster.wait_full(["pod0", "pod1", "pod2"], {0, 1, 2})
        before = len(cluster.devices["pod0"].applied)
        await cluster.start(3)
        await cluster.wait_full(["pod0"], {0, 1, 2, 3})
        new_plans = cluster.devices["pod0"].applied[before:]
        assert [(len(p.add), len(p.remove), len(p.update)) for p in new_plans] == [(1, 0, 0)]

        # A graceful stop revokes the lease: peers drop the rank without waiting for the TTL.
        before = len(cluster.devices["pod0"].applied)
        cluster.stop("pod3")
        with trio.fail_after(1.0):
            while 3 in cluster.peer_ranks("pod0"):
                await trio.sleep(0.05)
        new_plans = cluster.devices["pod0"].applied[before:]
        assert [(len(p.add), len(p.remove), len(p.update)) for p in new_plans] == [(0, 1, 0)]
        nursery.cancel_scope.cancel()


async def test_the_exit_file_ends_the_daemon_and_releases_the_rank(tmp_path, autojump_clock):
    """A launcher's "job done" marker (VNETD_EXIT_ON_FILE): run_daemon returns by itself,
    the lease is revoked (peers drop the rank long before the TTL); other daemons run on."""
    marker = tmp_path / "flux-operator-complete.txt"
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, size=3)
        await cluster.start(0)
        await cluster.start(1, env={"VNETD_EXIT_ON_FILE": str(marker)})
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        await trio.sleep(30)  # no marker, no exit
        assert "pod1" not in cluster.returned
        marker.touch()
        with trio.fail_after(2.0):  # the lease TTL is 6 s
            while 1 in cluster.peer_ranks("pod0") or "pod1" not in cluster.returned:
                await trio.sleep(0.05)
        assert await cluster.registry.get(member_key(cluster.running["pod0"].spec, 1)) is None
        assert "pod0" not in cluster.returned
        nursery.cancel_scope.cancel()


async def test_an_exit_file_there_at_start_ends_the_daemon_before_it_claims(tmp_path):
    """``--exit-on-file`` (the flag): a container restarted after its job ended does
    not come back up (real clock: autojump would jump over the file check's thread)."""
    marker = tmp_path / "done"
    marker.touch()
    config = tmp_path / "mesh.toml"
    config.write_text(SPEC.format(size=2))
    settings = Settings(
        spec=load_spec(config), rank="1", state_dir=tmp_path / "pod1", instance="pod1",
        exit_on_file=marker,
    )  # fmt: skip
    registry = MemoryRegistry()

    @asynccontextmanager
    async def opened(spec: MeshSpec) -> AsyncIterator[Registry]:
        yield registry

    with trio.fail_after(10):
        await run_daemon(
            daemon_settings(settings, {"POD_IP": "198.18.1.2"}), open_dataplane=cluster_device,
            open_registry=opened,
        )  # fmt: skip
    assert await registry.get(member_key(settings.spec, 1)) is None
    assert not (tmp_path / "pod1").exists(), "returned before making a key"


@asynccontextmanager
async def cluster_device(config: DeviceConfig) -> AsyncIterator[FakeDataplane]:
    device = FakeDataplane(config)
    try:
        yield device
    finally:
        device.close()


async def test_registry_outage_leaves_data_plane_alone(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (0, 1, 2):
            await cluster.start(rank)
        await cluster.wait_full(["pod0", "pod1", "pod2"], {0, 1, 2})
        applied = {n: len(d.applied) for n, d in cluster.devices.items()}
        peers = {n: dict(d.device) for n, d in cluster.devices.items()}

        cluster.registry.fail(True)
        await trio.sleep(120)  # far past the lease TTL and several resyncs
        assert {n: len(d.applied) for n, d in cluster.devices.items()} == applied
        assert {n: dict(d.device) for n, d in cluster.devices.items()} == peers
        assert all(r.health.reachable is False for r in cluster.running.values())

        cluster.registry.fail(False)
        await cluster.start(3)
        await cluster.wait_full(["pod0", "pod1", "pod2", "pod3"], {0, 1, 2, 3})
        assert all(r.health.reachable for r in cluster.running.values())
        nursery.cancel_scope.cancel()


async def test_lost_lease_is_reclaimed(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0 = await cluster.start(0)
        await cluster.start(1)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        await cluster.registry.revoke(r0.claim.lease)  # as if etcd forgot it
        with trio.fail_after(10):
            while await cluster.registry.get(member_key(r0.spec, 0)) is None or r0.claim.claims < 2:
                await trio.sleep(0.1)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        nursery.cancel_scope.cancel()


async def test_rank_held_by_another_instance_waits(tmp_path, autojump_clock, caplog):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        first = await cluster.start(1, instance="pod-a")
        second = await cluster.start(1, instance="pod-b")
        await trio.sleep(20)
        assert first.claim.claimed.is_set()
        assert not second.claim.claimed.is_set()
        assert "rank 1 is held by pod-a" in caplog.text
        cluster.stop("pod-a")
        with trio.fail_after(10):
            await second.claim.claimed.wait()
        entry = await cluster.registry.get(member_key(second.spec, 1))
        assert entry is not None and b'"instance":"pod-b"' in entry.value
        nursery.cancel_scope.cancel()


async def test_restart_with_same_instance_takes_over(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        # A stale entry from this pod's previous process, under a lease still alive.
        lease = await cluster.registry.grant(3600)
        stale = Member(1, "A" * 43 + "=", "198.18.9.9:51820", "pod1")
        running = await cluster.start(0)
        await cluster.registry.create(member_key(running.spec, 1), encode_member(stale), lease)
        r1 = await cluster.start(1)
        with trio.fail_after(5):
            await r1.claim.claimed.wait()
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        assert {p.endpoint for p in cluster.devices["pod0"].device.values()} == {"198.18.1.2:51820"}
        nursery.cancel_scope.cancel()


async def test_spec_mismatch_is_refused(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await cluster.start(0)
        cluster.config.write_text(SPEC.format(size=5))
        with pytest.raises(SpecMismatch, match=r"mesh\.size: registry has 4, local 5"):
            await cluster.start(1)
        nursery.cancel_scope.cancel()


async def test_bad_registry_entry_is_skipped_and_counted(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0 = await cluster.start(0)
        await cluster.start(1)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        await cluster.registry.create(member_key(r0.spec, 2), b"{garbage")
        await cluster.registry.create(member_key(r0.spec, 0) + "x", b"{}")
        await trio.sleep(1)
        assert r0.view.bad_total == 2
        assert cluster.peer_ranks("pod0") == {1}
        await cluster.start(3)
        await cluster.wait_full(["pod0"], {0, 1, 3})
        nursery.cancel_scope.cancel()


async def test_known_peers_are_on_the_device_before_the_claim(tmp_path, autojump_clock):
    """Whoever learns of rank 0 from the registry must already be its peer, so
    their first handshake to it is answered instead of dropped."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for rank in (1, 2, 3):
            await cluster.start(rank)
        seen_at_claim: list[set[int]] = []
        create = cluster.registry.create
        key0 = member_key(cluster.running["pod1"].spec, 0)

        async def watching_create(key: str, value: bytes, lease: int = 0):
            if key == key0:
                seen_at_claim.append(cluster.peer_ranks("pod0"))
            return await create(key, value, lease)

        cluster.registry.create = watching_create  # type: ignore[method-assign]
        await cluster.start(0)
        await cluster.wait_full(["pod0", "pod1"], {0, 1, 2, 3})
        assert seen_at_claim == [{1, 2, 3}]
        nursery.cancel_scope.cancel()


DUAL_STACK = 'network6 = "fd00:250::/64"\n'


async def test_dual_stack_peers_get_both_host_routes(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, size=3)
        cluster.config.write_text(
            SPEC.format(size=3).replace("[registry]", DUAL_STACK + "[registry]")
        )
        for rank in range(3):
            await cluster.start(rank)
        await cluster.wait_full(["pod0", "pod1", "pod2"], {0, 1, 2})
        device = cluster.devices["pod1"]
        assert [str(a) for a in device.config.addresses] == ["10.250.0.2/16", "fd00:250::2/64"]
        assert device.unreachable == {"10.250.0.0/16", "fd00:250::/64"}
        assert sorted(p.allowed_ips for p in device.device.values()) == [
            ("10.250.0.1/32", "fd00:250::1/128"),
            ("10.250.0.3/32", "fd00:250::3/128"),
        ]
        assert await device.routes() == {
            "10.250.0.1/32", "fd00:250::1/128", "10.250.0.3/32", "fd00:250::3/128"
        }  # fmt: skip
        link = await device.link_state()
        assert {"10.250.0.2", "fd00:250::2"} <= link.addresses
        nursery.cancel_scope.cancel()


async def test_a_daemon_with_network6_refuses_a_mesh_created_without(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await cluster.start(0)
        cluster.config.write_text(
            SPEC.format(size=4).replace("[registry]", DUAL_STACK + "[registry]")
        )
        with pytest.raises(SpecMismatch, match=r"mesh\.network6: registry has None, local 'fd00"):
            await cluster.start(1)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("flag", "env", "source"),
    [
        pytest.param(Path(""), {}, "--exit-on-file", id="empty-flag"),
        pytest.param(None, {"VNETD_EXIT_ON_FILE": "/"}, "VNETD_EXIT_ON_FILE", id="directory"),
    ],
)
def test_an_exit_file_that_is_no_file_is_named(flag, env, source) -> None:
    from vnetd.daemon_settings import resolve_exit_file
    from vnetd.errors import VnetdError

    with pytest.raises(VnetdError, match=f"{source}: .* empty or a directory"):
        resolve_exit_file(flag, env)
