"""A test control MemoryRegistry lacks: lose every key, as etcd on a new data dir."""

from __future__ import annotations

from vnetd.registry.memory import MemoryRegistry


def wipe(registry: MemoryRegistry) -> None:
    """Empty the store as etcd restarted on a new data dir would: revision 1, no
    keys, no leases, no history. Call it while ``fail()`` is on (etcd is down),
    so open watches have broken as they would on a real restart."""
    if not registry._unavailable:
        raise RuntimeError("wipe() a registry that is down: call fail() first")
    registry._revision = 1
    registry._compacted = 0
    registry._store.clear()
    registry._leases.clear()
    registry._history.clear()
