"""What ``vnetd wait`` waits for, how far along it is, and the lines it prints.

Pure: no trio, no I/O. ``evaluate`` takes what the caller has observed (the
registered members' public keys, the keys the local device has completed a
handshake with) and returns whether the gate is open and a one-line summary.
``carriers`` and ``handshake_keys`` turn the device's peers into those inputs;
``vnetd wait --reachable`` and the MiniCluster's ``/gatez`` both call them, so a
rank reached through a site gateway counts the same way in both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from vnetd.model import DevicePeer
from vnetd.ranks import format_ranks
from vnetd.spec import MeshSpec


@dataclass(frozen=True)
class Gate:
    """The condition: every rank of ``ranks`` (``--ranks``), or ``min_peers`` (``--min-peers``).

    Attributes:
        size: the mesh size.
        ranks: the ranks that must be registered; unused when ``min_peers`` is set.
        min_peers: how many ranks other than ``self_rank`` must be registered.
        self_rank: this host's rank, or None when it cannot be resolved (then
            ``--min-peers`` counts any ranks; ``reachable`` needs it).
        reachable: also require a WireGuard handshake between this rank and
            each counted rank.
    """

    size: int
    ranks: tuple[int, ...] = ()
    min_peers: int | None = None
    self_rank: int | None = None
    reachable: bool = False

    def __post_init__(self) -> None:
        if self.reachable and self.self_rank is None:
            raise ValueError("a reachable gate needs this host's rank")


@dataclass(frozen=True)
class Status:
    ready: bool
    summary: str
    """``5/8 ranks registered, missing: 3, 4, 7`` and the like."""


def evaluate(
    gate: Gate,
    registered: Mapping[int, str],
    handshakes: Collection[str] = frozenset(),
    *,
    listed: bool = True,
) -> Status:
    """How far ``gate`` is from open.

    Args:
        registered: rank to public key of every valid member record.
        handshakes: public keys the local device has completed a handshake with.
        listed: whether the members have been read at least once; the gate
            never opens before (so ``--min-peers 0`` still needs the registry).
    """
    if gate.min_peers is None:
        ready, summary = _ranks_status(gate, registered, handshakes)
    else:
        ready, summary = _peers_status(gate, gate.min_peers, registered, handshakes)
    return Status(ready and listed, summary)


def _ranks_status(
    gate: Gate, registered: Mapping[int, str], handshakes: Collection[str]
) -> tuple[bool, str]:
    missing = [rank for rank in gate.ranks if rank not in registered]
    summary = f"{len(gate.ranks) - len(missing)}/{len(gate.ranks)} ranks registered"
    if missing:
        summary += f", missing: {format_ranks(missing)}"
    if not gate.reachable:
        return not missing, summary
    peers = [rank for rank in gate.ranks if rank != gate.self_rank]
    reached, silent = _split_by_handshake(peers, registered, handshakes)
    summary += f"; {len(reached)}/{len(peers)} peers reachable"
    if silent:
        summary += f", no handshake: {format_ranks(silent)}"
    return not missing and len(reached) == len(peers), summary


def _peers_status(
    gate: Gate, needed: int, registered: Mapping[int, str], handshakes: Collection[str]
) -> tuple[bool, str]:
    noun = "ranks" if gate.self_rank is None else "peers"
    present = sorted(rank for rank in registered if rank != gate.self_rank)
    if gate.reachable:
        reached, silent = _split_by_handshake(present, registered, handshakes)
        ready = len(reached) >= needed
        summary = f"{len(reached)} {noun} reachable (need {needed}), {len(present)} registered"
        if silent:
            summary += f", no handshake: {format_ranks(silent)}"
    else:
        ready = len(present) >= needed
        summary = f"{len(present)} {noun} registered (need {needed})"
    if not ready:
        absent = _absent(gate, registered)
        if absent:
            summary += f", unregistered: {format_ranks(absent)}"
    return ready, summary


def _split_by_handshake(
    ranks: Sequence[int], registered: Mapping[int, str], handshakes: Collection[str]
) -> tuple[list[int], list[int]]:
    """The registered ones of ``ranks``: (with a handshake, without one)."""
    reached: list[int] = []
    silent: list[int] = []
    for rank in ranks:
        key = registered.get(rank)
        if key is not None:
            (reached if key in handshakes else silent).append(rank)
    return reached, silent


def carriers(
    spec: MeshSpec, registered: Mapping[int, str], peers: Mapping[str, DevicePeer]
) -> dict[int, str]:
    """Each registered rank with the key whose handshake reaches it: that of the device peer
    holding its address (invariant 2: one peer holds it).

    For a rank of another site reached through a site gateway (``mesh.gateways``) that is
    the gateway's peer, as the rank has none of its own on this device. A holder counts
    only when its key is a registered member's (the rank's own, or its gateway's): a peer
    left from a key the rank no longer has does not stand in for it. A rank no such peer
    holds keeps its own key.
    """
    members = set(registered.values())
    holder = {ip: key for key, peer in peers.items() if key in members for ip in peer.allowed_ips}
    return {rank: holder.get(spec.allowed_ips(rank)[0], key) for rank, key in registered.items()}


def handshake_keys(peers: Mapping[str, DevicePeer]) -> frozenset[str]:
    """The keys of the device peers that have completed a handshake."""
    return frozenset(key for key, peer in peers.items() if peer.last_handshake > 0)


def _absent(gate: Gate, registered: Mapping[int, str]) -> list[int]:
    return [r for r in range(gate.size) if r not in registered and r != gate.self_rank]


def tbon_neighbours(rank: int, size: int, fanout: int) -> tuple[int, ...]:
    """The ranks ``rank``'s Flux broker connects to: its parent and its children in
    Flux's k-ary tree of ``fanout`` (``tbon.topo`` ``kary:K``: rank r's parent is
    ``(r - 1) // K``), ascending.

    What a MiniCluster's gate waits for (docs/flux.md, "The mesh gate"): a broker talks
    to these alone (ZeroMQ over TCP on the overlay), so together the gates of all ranks
    cover every edge of the tree, and a broker whose edges all answer can join.
    """
    if fanout < 1:
        raise ValueError("a tree needs a fanout of 1 or more")
    parent = () if rank == 0 else ((rank - 1) // fanout,)
    first = rank * fanout + 1
    return parent + tuple(range(first, min(first + fanout, size)))


def progress_line(summary: str, notes: Sequence[str], elapsed: float, timeout: float) -> str:
    """``vnetd wait: 5/8 ranks registered, missing: 3, 4, 7 (12 s of 300 s)``."""
    return f"vnetd wait: {_with_notes(summary, notes)} ({elapsed:.0f} s of {timeout:g} s)"


def ready_line(summary: str, elapsed: float) -> str:
    """``vnetd wait: 8/8 ranks registered after 3.2 s``."""
    return f"vnetd wait: {summary} after {elapsed:.1f} s"


def timeout_line(summary: str, notes: Sequence[str], timeout: float) -> str:
    """``vnetd: timed out after 300 s: 6/8 ranks registered, missing: 3, 7``."""
    return f"vnetd: timed out after {timeout:g} s: {_with_notes(summary, notes)}"


def _with_notes(summary: str, notes: Sequence[str]) -> str:
    return "; ".join([summary, *notes])
