"""Sticky rank assignment (``--rank auto``) on the memory registry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from shared import daemon_settings

from vnetd.config import Settings
from vnetd.control.assign import MeshFull, assign_key, assign_rank, assigned_rank_key
from vnetd.control.proof import Signer
from vnetd.daemon.root import run_daemon
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.errors import IdentityError, RegistryError, SpecError
from vnetd.identity import wants_auto_rank
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec, parse_spec

SPEC = parse_spec({"mesh": {"name": "nodes", "size": 4, "network": "10.250.0.0/16"}})


async def test_first_start_takes_the_lowest_free_rank_and_keeps_it() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        assert await assign_rank(registry, SPEC, "node-b") == 0
        assert await assign_rank(registry, SPEC, "node-a") == 1
        assert await assign_rank(registry, SPEC, "node-b") == 0  # sticky
        stored = await registry.get(assign_key(SPEC, "node-a"))
        assert stored is not None and json.loads(stored.value) == {"node": "node-a", "rank": 1}
        assert stored.lease == 0
        owner = await registry.get(assigned_rank_key(SPEC, 1))
        assert owner is not None and owner.value == b"node-a"


async def test_a_freed_rank_is_reused() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        for node in ("n0", "n1", "n2"):
            await assign_rank(registry, SPEC, node)
        await registry.delete(assign_key(SPEC, "n1"))
        await registry.delete(assigned_rank_key(SPEC, 1))
        assert await assign_rank(registry, SPEC, "n3") == 1


class YieldingRegistry(MemoryRegistry):
    """Lets every other task run before each call, so concurrent starts interleave
    (the memory registry itself never yields)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost_races = 0

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        await trio.lowlevel.checkpoint()
        return await super().get(key)

    async def list_prefix(self, prefix: str):  # type: ignore[no-untyped-def]
        await trio.lowlevel.checkpoint()
        return await super().list_prefix(prefix)

    async def create_all(self, items):  # type: ignore[no-untyped-def]
        await trio.lowlevel.checkpoint()
        written = await super().create_all(items)
        self.lost_races += not written
        return written


async def test_concurrent_first_starts_get_distinct_ranks() -> None:
    registry = YieldingRegistry()
    got: dict[str, int] = {}

    async def start(node: str) -> None:
        got[node] = await assign_rank(registry, SPEC, node)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(start, f"node-{i}")
    assert sorted(got.values()) == [0, 1, 2, 3]
    assert registry.lost_races > 0, "the starts did not race; the test proves nothing"


async def test_a_full_mesh_is_a_clear_error() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        for i in range(4):
            await assign_rank(registry, SPEC, f"node-{i}")
        with pytest.raises(MeshFull, match=r"mesh 'nodes' is full: all 4 ranks are assigned"):
            await assign_rank(registry, SPEC, "node-4")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param(b"not json", "not an assignment record", id="garbage"),
        pytest.param(b'{"rank": 9}', "outside mesh", id="out-of-range"),
        pytest.param(b'{"rank": true}', "outside mesh", id="boolean"),
    ],
)
async def test_a_bad_stored_assignment_names_the_key(value: bytes, why: str) -> None:
    registry = MemoryRegistry()
    await registry.create(assign_key(SPEC, "node-a"), value)
    with trio.fail_after(5), pytest.raises(RegistryError, match=why):
        await assign_rank(registry, SPEC, "node-a")


@pytest.mark.parametrize("node", ["", "a/b", "-x", "x" * 300, "a b"])
async def test_a_node_name_that_cannot_be_a_key_is_refused(node: str) -> None:
    with pytest.raises(SpecError, match="--instance"):
        await assign_rank(MemoryRegistry(), SPEC, node)


@pytest.mark.parametrize(
    ("flag", "env", "auto"),
    [
        pytest.param("auto", {}, True, id="flag"),
        pytest.param(" AUTO ", {}, True, id="flag-case"),
        pytest.param(None, {"VNETD_RANK": "auto"}, True, id="env"),
        pytest.param("3", {"VNETD_RANK": "auto"}, False, id="flag-wins"),
        pytest.param(None, {}, False, id="none"),
    ],
)
def test_wants_auto_rank(flag: str | None, env: dict[str, str], auto: bool) -> None:
    assert wants_auto_rank(flag, env) is auto


async def auto_rank_daemon(tmp_path: Path, spec_text: str, registry: MemoryRegistry) -> int:
    """Run ``vnetd up --rank auto`` (node ``node-x``) on ``registry`` and a fake data
    plane until it has claimed; its rank."""

    @asynccontextmanager
    async def open_registry(spec: MeshSpec) -> AsyncIterator[Registry]:
        yield registry

    @asynccontextmanager
    async def open_dataplane(device: DeviceConfig) -> AsyncIterator[FakeDataplane]:
        yield FakeDataplane(device)

    config = tmp_path / "mesh.toml"
    config.write_text(spec_text)
    opts = Settings(
        spec=load_spec(config), rank="auto", state_dir=tmp_path / "state", instance="node-x"
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            running = await nursery.start(
                lambda task_status: run_daemon(
                    daemon_settings(opts, {"POD_IP": "198.18.1.5"}),
                    open_dataplane=open_dataplane,
                    open_registry=open_registry,
                    task_status=task_status,
                )
            )
            await running.claim.claimed.wait()
            nursery.cancel_scope.cancel()
    rank: int = running.me.rank
    return rank


NODES_TOML = '[mesh]\nname = "nodes"\nsize = 4\nnetwork = "10.250.0.0/16"\n'


async def test_a_daemon_with_rank_auto_registers_under_its_assigned_rank(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    await registry.create_all({assigned_rank_key(SPEC, 0): b"other-node"})
    for _ in range(2):  # a restart keeps the rank
        assert await auto_rank_daemon(tmp_path, NODES_TOML, registry) == 1


# --- gateway ranks pinned to a signing key (docs/security.md, "Gateway ranks") ---------------

GATEWAY_KEY = Signer.generate().public_key
OTHER_KEY = Signer.generate().public_key
PINNED = parse_spec(
    {
        "mesh": {"name": "nodes", "size": 4, "network": "10.250.0.0/16"},
        "sites": {"b": {"gateways": [0, 2], "gateway_keys": {"0": GATEWAY_KEY}}},
    }
)


async def test_a_rank_pinned_to_another_key_is_never_assigned() -> None:
    """Rank 0 is pinned: nodes with other keys get 1, 2, 3 and then a full mesh (their
    daemons could not claim rank 0: ``vnetd up`` would exit 2)."""
    registry = MemoryRegistry()
    with trio.fail_after(5):
        got = [await assign_rank(registry, PINNED, f"n{i}", OTHER_KEY) for i in range(3)]
        assert got == [1, 2, 3]
        with pytest.raises(MeshFull, match=r"all 4 ranks are assigned to other nodes "
                           r"\(keys under .*\), 1 pinned to other signing keys"):  # fmt: skip
            await assign_rank(registry, PINNED, "n3", OTHER_KEY)
        # The node with the pinned key gets its rank, however many are taken.
        assert await assign_rank(registry, PINNED, "gw", GATEWAY_KEY) == 0


async def test_the_node_with_a_pinned_key_gets_its_rank_first() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        assert await assign_rank(registry, PINNED, "gw", GATEWAY_KEY) == 0
        assert await assign_rank(registry, PINNED, "n1", OTHER_KEY) == 1
        assert await assign_rank(registry, PINNED, "gw", GATEWAY_KEY) == 0  # sticky


async def test_a_node_assigned_a_rank_pinned_since_is_told_which_keys_to_delete() -> None:
    """Assigned rank 0 before the pin: not moved (its address is what others know it
    by); it stops with the pin and the two keys that free it."""
    registry = MemoryRegistry()
    with trio.fail_after(5):
        assert await assign_rank(registry, SPEC, "n0", OTHER_KEY) == 0
        with pytest.raises(IdentityError, match=r"node n0 is assigned rank 0 \(.*/assign/n0\), "
                           r"which sites\.b\.gateway_keys\.0 pins to signing key .*; run it with "
                           r"the pinned key \(--signing-key-file\), or delete .*/assign/n0 and "
                           r".*/assign-rank/0 to give it another rank"):  # fmt: skip
            await assign_rank(registry, PINNED, "n0", OTHER_KEY)
        await registry.delete(assign_key(SPEC, "n0"))
        await registry.delete(assigned_rank_key(SPEC, 0))
        assert await assign_rank(registry, PINNED, "n0", OTHER_KEY) == 1


async def test_a_daemon_with_rank_auto_skips_a_rank_pinned_to_another_key(tmp_path: Path) -> None:
    """The daemon reads its signing key before it asks for a rank: with rank 0 pinned
    to another key it gets rank 1, and claims it."""
    pins = f'[sites.b]\ngateways = [0, 2]\ngateway_keys = {{ 0 = "{GATEWAY_KEY}" }}\n'
    assert await auto_rank_daemon(tmp_path, NODES_TOML + pins, MemoryRegistry()) == 1
