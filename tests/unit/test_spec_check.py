"""A running daemon's spec check: a changed stored spec reported once, a lost one put back."""

from __future__ import annotations

import logging

import pytest
import trio

from vnetd.control.membership import ensure_spec, spec_key
from vnetd.control.spec_check import SPEC_CHECK_TTLS, SPEC_READS, SpecCheck
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 8, "network": "10.250.0.0/16"}})
OTHER = parse_spec({"mesh": {"name": "m", "size": 9, "network": "10.250.0.0/16"}})


async def overwrite(registry: MemoryRegistry, value: bytes) -> None:
    stored = await registry.get(spec_key(SPEC))
    assert stored is not None
    assert await registry.replace(spec_key(SPEC), value, stored.mod_revision)


async def test_a_changed_spec_is_reported_once_and_cleared(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    caplog.set_level(logging.INFO, "vnetd.claim")
    registry = MemoryRegistry()
    await ensure_spec(registry, SPEC)
    check = SpecCheck(registry, SPEC)
    interval = SPEC_CHECK_TTLS * SPEC.registry.lease_ttl
    async with trio.open_nursery() as nursery:
        nursery.start_soon(check.run)
        await overwrite(registry, OTHER.canonical_json())
        await trio.sleep(interval - 1)
        assert check.differs is None, "not due yet"
        await trio.sleep(2)
        assert check.differs is not None and "mesh.size" in check.differs
        await trio.sleep(interval)  # checked again: the same difference, no new line
        nursery.cancel_scope.cancel()
    assert caplog.text.count("keeps running with the spec it checked at start") == 1
    await overwrite(registry, SPEC.canonical_json())
    await check.check()
    assert check.differs is None
    assert "matches ours again" in caplog.text
    await registry.delete(spec_key(SPEC))
    await check.check()
    assert "stored it again" in caplog.text
    stored = await registry.get(spec_key(SPEC))
    assert stored is not None and stored.value == SPEC.canonical_json()


async def test_a_large_mesh_spaces_its_checks_by_its_size(autojump_clock: trio.abc.Clock) -> None:
    # 1024 daemons each reading every two TTLs would cost etcd 51 reads a second.
    registry = CountingReads()
    await ensure_spec(registry, SPEC)
    registry.gets = 0
    members = [8]
    check = SpecCheck(registry, SPEC, lambda: members[0])
    interval = SPEC_CHECK_TTLS * SPEC.registry.lease_ttl
    async with trio.open_nursery() as nursery:
        nursery.start_soon(check.run)
        await trio.sleep(interval * 10 + 1)
        assert registry.gets == 10, "a small mesh checks every two TTLs"
        members[0] = 1024
        registry.gets = 0
        await trio.sleep(interval)  # the wait already begun
        await trio.sleep(1024 / SPEC_READS * 4)
        # Spaced at 1024 / SPEC_READS s, jittered down by at most a quarter.
        assert 4 <= registry.gets <= 6, registry.gets
        nursery.cancel_scope.cancel()


class CountingReads(MemoryRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        self.gets += 1
        return await super().get(key)
