"""Sticky rank assignment for nodes without a pod index (``vnetd up --rank auto``).

A DaemonSet pod has no completion index, so the rank comes from the
registry. Two keys, no lease, so the assignment survives every restart::

    <prefix>/<mesh>/assign/<node>         the node's rank (JSON)
    <prefix>/<mesh>/assign-rank/<rank>    the node holding that rank

A node that has an assignment gets it back. Otherwise it takes the lowest
rank with no ``assign-rank`` key, writing both keys in one etcd transaction
that succeeds only if neither exists; losing that race to another node only
moves it on to the next free rank, so concurrent first starts get distinct
ranks. To free a rank, delete both keys (``docs/operations.md``).

A gateway rank whose signing key the spec pins (``[sites.<name>]
gateway_keys``) is never assigned to a node with another signing key: that
node could not claim it (its records would be refused, and ``vnetd up``
exits 2 for it). A node that holds a pinned key gets that rank first, if
free. A node whose earlier assignment is now pinned to another key is not
moved (its rank, so its address, is what others know it by): it stops with
the keys to delete.
"""

from __future__ import annotations

import json
import logging
import re

from vnetd.control.membership import mesh_prefix
from vnetd.errors import IdentityError, RegistryError, SpecError
from vnetd.registry.base import Registry
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.assign")

_NODE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")


class MeshFull(SpecError):
    """Every rank of the mesh is assigned to another node."""


def assign_prefix(spec: MeshSpec) -> str:
    return f"{mesh_prefix(spec)}/assign/"


def assign_key(spec: MeshSpec, node: str) -> str:
    return f"{assign_prefix(spec)}{node}"


def assigned_rank_key(spec: MeshSpec, rank: int) -> str:
    return f"{mesh_prefix(spec)}/assign-rank/{rank}"


def check_node(node: str) -> str:
    """A node name usable in a key: a DNS-style name (what Kubernetes allows)."""
    if not _NODE.fullmatch(node):
        raise SpecError(
            f"--rank auto: node name {node!r} is not a DNS name (letters, digits, '.', '-', '_'; "
            "at most 253); set it with --instance"
        )
    return node


async def assign_rank(registry: Registry, spec: MeshSpec, node: str, signing_key: str = "") -> int:
    """The rank of ``node``: its existing assignment, else the lowest free rank it
    may claim (``candidates``).

    Args:
        signing_key: the node's record signing public key ("" : none).

    Raises:
        MeshFull: no free rank is left.
        IdentityError: the node's assignment is a rank pinned to another signing key.
        RegistryError: the stored assignment is unreadable, or out of range.
        RegistryUnavailable: etcd did not answer (the caller retries).
    """
    check_node(node)
    existing = await _assigned(registry, spec, node)
    if existing is not None:
        _claimable(spec, node, existing, signing_key)
        log.info("node %s keeps rank %d (assigned before)", node, existing)
        return existing
    taken_kvs, _ = await registry.list_prefix(f"{mesh_prefix(spec)}/assign-rank/")
    taken = {_rank_of(kv.key) for kv in taken_kvs}
    for rank in candidates(spec, signing_key):
        if rank in taken:
            continue
        record = json.dumps({"node": node, "rank": rank}, sort_keys=True).encode()
        items = {assign_key(spec, node): record, assigned_rank_key(spec, rank): node.encode()}
        if await registry.create_all(items):
            which = "pinned to its signing key" if spec.pinned_key(rank) else "lowest free"
            log.info("node %s assigned rank %d (%s)", node, rank, which)
            return rank
        # Lost a race: either our node key appeared (another process of this
        # node) or the rank was taken. Check ours, then try the next rank.
        existing = await _assigned(registry, spec, node)
        if existing is not None:
            return _claimable(spec, node, existing, signing_key)
    pinned = sum(1 for _, key in spec.gateway_keys if key != signing_key)
    others = f", {pinned} pinned to other signing keys" if pinned else ""
    raise MeshFull(
        f"--rank auto: mesh {spec.name!r} is full: all {spec.size} ranks are assigned to "
        f"other nodes (keys under {assign_prefix(spec)}){others}; delete a stale node's two "
        "keys or raise mesh.size"
    )


def candidates(spec: MeshSpec, signing_key: str) -> list[int]:
    """The ranks a node with ``signing_key`` may be assigned, in the order it tries
    them: the ranks pinned to its key, then every rank no pin names."""
    pinned = dict(spec.gateway_keys)
    own = [rank for rank, key in spec.gateway_keys if key == signing_key]
    return own + [rank for rank in range(spec.size) if rank not in pinned]


def _claimable(spec: MeshSpec, node: str, rank: int, signing_key: str) -> int:
    """``rank``, if ``node`` may claim it.

    Raises:
        IdentityError: the spec pins ``rank`` to another signing key.
    """
    pinned = spec.pinned_key(rank)
    if pinned is None or pinned == signing_key:
        return rank
    raise IdentityError(
        f"--rank auto: node {node} is assigned rank {rank} ({assign_key(spec, node)}), which "
        f"sites.{spec.site_of_gateway(rank)}.gateway_keys.{rank} pins to signing key "
        f"{pinned[:12]!r}, and this node's is {signing_key[:12]!r}; run it with the pinned "
        f"key (--signing-key-file), or delete {assign_key(spec, node)} and "
        f"{assigned_rank_key(spec, rank)} to give it another rank"
    )


async def _assigned(registry: Registry, spec: MeshSpec, node: str) -> int | None:
    kv = await registry.get(assign_key(spec, node))
    if kv is None:
        return None
    try:
        rank = json.loads(kv.value)["rank"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{kv.key}: not an assignment record; delete it") from None
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < spec.size:
        raise RegistryError(
            f"{kv.key}: rank {rank!r} is outside mesh {spec.name!r} (0..{spec.size - 1}); "
            "delete it to get a new rank"
        )
    return rank


def _rank_of(key: str) -> int:
    tail = key.rpartition("/")[2]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) < 10 else -1
