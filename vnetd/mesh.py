"""The mesh as a pure function: which peers a rank wants, and how to get there.

``desired_peers`` turns registry members into WireGuard peers whose allowed
IPs come from each rank through the *local* spec (DESIGN invariant 1): a
registry entry can move an endpoint, never an address. ``diff`` compares
that with the device and yields the smallest ``Plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vnetd.model import DevicePeer, Member, Peer, PeerUpdate, Plan
from vnetd.spec import MeshSpec


@dataclass(frozen=True)
class Skipped:
    """A member left out of the desired peers, and why."""

    rank: int
    reason: str


def desired_peers(
    members: Mapping[int, Member], self_rank: int, spec: MeshSpec, self_key: str = ""
) -> tuple[dict[str, Peer], list[Skipped]]:
    """The peers ``self_rank`` should have, keyed by public key.

    A public key registered under several ranks is kept for the lowest rank
    only, and our own key under another rank is ignored: either way no
    overlay address can end up on two peers.

    Returns:
        The desired peers and the members that were skipped, with reasons.
    """
    peers: dict[str, Peer] = {}
    skipped: list[Skipped] = []
    for rank in sorted(members):
        member = members[rank]
        if rank == self_rank:
            continue
        if not 0 <= rank < spec.size:
            skipped.append(Skipped(rank, f"rank out of range 0..{spec.size - 1}"))
            continue
        if member.public_key == self_key:
            skipped.append(Skipped(rank, "registers this rank's own public key"))
            continue
        holder = peers.get(member.public_key)
        if holder is not None:
            skipped.append(Skipped(rank, f"public key already registered by rank {holder.rank}"))
            continue
        peers[member.public_key] = Peer(
            public_key=member.public_key,
            allowed_ips=spec.allowed_ips(rank),
            endpoint=member.endpoint,
            rank=rank,
        )
    return peers, skipped


def diff(
    desired: Mapping[str, Peer],
    actual: Mapping[str, DevicePeer | Peer],
    written: Mapping[str, str | None],
) -> Plan:
    """The changes that turn ``actual`` into ``desired``.

    Args:
        desired: from ``desired_peers``.
        actual: the device's peers, keyed by public key.
        written: for each peer, the registry endpoint that was last written
            to the device. An endpoint is written only when the registry's
            value changes, never because the device differs from it: the
            device may have roamed to the peer's real source address behind
            a NAT (DESIGN invariant 4).

    Returns:
        A plan that removes, updates and adds only what changed.
    """
    remove = tuple(
        Peer(key, peer.allowed_ips, peer.endpoint)
        for key, peer in sorted(actual.items())
        if key not in desired
    )
    add: list[Peer] = []
    update: list[PeerUpdate] = []
    for key, want in sorted(desired.items()):
        have = actual.get(key)
        if have is None:
            add.append(want)
            continue
        endpoint = _endpoint_change(want, have, written)
        allowed = want.allowed_ips if tuple(sorted(have.allowed_ips)) != want.allowed_ips else None
        if endpoint is not None or allowed is not None:
            update.append(
                PeerUpdate(key, endpoint, allowed, old_allowed_ips=tuple(have.allowed_ips))
            )
    return Plan(remove=remove, update=tuple(update), add=tuple(add))


def _endpoint_change(
    want: Peer, have: DevicePeer | Peer, written: Mapping[str, str | None]
) -> str | None:
    if want.endpoint is None:
        return None
    if want.public_key in written:
        changed = written[want.public_key] != want.endpoint
    else:
        changed = have.endpoint != want.endpoint
    return want.endpoint if changed else None


def written_after(desired: Mapping[str, Peer]) -> dict[str, str | None]:
    """The ``written`` map once a plan for ``desired`` has been applied."""
    return {key: peer.endpoint for key, peer in desired.items()}
