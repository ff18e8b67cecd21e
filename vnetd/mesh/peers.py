"""The mesh as a pure function: which peers a rank wants, and how to get there.

``desired_peers`` turns registry members into WireGuard peers whose allowed
IPs come from each rank through the *local* spec (invariant 1): a
registry entry can move an endpoint, never an address. ``diff`` compares
that with the device and yields the smallest ``Plan``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from vnetd.mesh.eager import doorbell_endpoint
from vnetd.mesh.gateways import route_through_gateways
from vnetd.mesh.initiator import SESSION_DEAD, PairRule
from vnetd.model import DevicePeer, Member, Peer, PeerUpdate, Plan
from vnetd.spec import MeshSpec


@dataclass(frozen=True)
class Skipped:
    """A member left out of the desired peers, and why."""

    rank: int
    reason: str


def desired_peers(
    members: Mapping[int, Member],
    self_rank: int,
    spec: MeshSpec,
    self_key: str = "",
    created: Mapping[int, int] | None = None,
) -> tuple[dict[str, Peer], list[Skipped]]:
    """The peers ``self_rank`` should have, keyed by public key.

    A public key registered under several ranks belongs to its earliest
    registration: the entry with the lowest create revision in ``created``
    (rank -> the store revision that created its entry), the lowest rank among
    equals or when ``created`` is not given. A later entry carrying a key that
    is already registered is skipped, so a copy of a member's key written under
    a free rank (lower or higher) never takes that member's peer. Our own key
    under another rank is ignored. Either way no overlay address can end up on
    two peers, and a peer's address is only ever its own rank's.

    Returns:
        The desired peers and the members that were skipped, with reasons.
    """
    peers: dict[str, Peer] = {}
    skipped: list[Skipped] = []
    order = created or {}
    for rank in sorted(members, key=lambda r: (order.get(r, math.inf), r)):
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
            endpoint=peer_endpoint(member, spec.site.name),
            rank=rank,
            device_id=member.device_id,
            keepalive=_site_keepalive(member, spec),
        )
    skipped.sort(key=lambda item: item.rank)
    return route_through_gateways(peers, members, self_rank, spec), skipped


def peer_endpoint(member: Member, site: str) -> str | None:
    """The endpoint a daemon in ``site`` uses for ``member`` (docs/architecture.md, "Sites"):
    its site endpoint within its own site, else its public one; None when it has
    none (it can still reach us, and WireGuard roams to where it sends from)."""
    return member.endpoint_from(site)


def _site_keepalive(member: Member, spec: MeshSpec) -> int | None:
    """A peer in another site keeps its NAT mappings open: ``site_keepalive`` (if on)."""
    if member.site == spec.site.name or not spec.site_keepalive:
        return None
    return spec.site_keepalive


class AppliedPeers:
    """The peers a reconciler last applied, and every member's public key as of its
    last pass: what a pass diffs a change against instead of the device (invariant 11).

    A key's peer depends only on the members that register that key (the
    earliest holds it), so a change to some ranks can change only the peers of
    the keys those ranks registered before or after it.
    """

    def __init__(self) -> None:
        self.peers: dict[str, Peer] = {}
        """Public key -> the peer as last applied."""
        self._at: dict[str, set[str]] = {}  # an endpoint -> the keys of the peers there
        self._key_of: dict[int, str] = {}
        self._ranks_of: dict[str, set[int]] = {}

    def index(self, members: Mapping[int, Member]) -> None:
        """Note every member's key (a full pass)."""
        self._key_of, self._ranks_of = {}, {}
        self.touched(members, members)

    def touched(
        self, members: Mapping[int, Member], changed: Iterable[int]
    ) -> tuple[dict[int, Member], set[str]]:
        """Note the ``changed`` ranks' keys; the keys they had or have now, and every
        member registering one of those keys (``desired_peers`` of exactly those keys)."""
        keys: set[str] = set()
        for rank in changed:
            old = self._key_of.pop(rank, None)
            if old is not None:
                keys.add(old)
                self._ranks_of[old].discard(rank)
                if not self._ranks_of[old]:
                    del self._ranks_of[old]
            member = members.get(rank)
            if member is not None:
                keys.add(member.public_key)
                self._key_of[rank] = member.public_key
                self._ranks_of.setdefault(member.public_key, set()).add(rank)
        holders = {rank: members[rank] for key in keys for rank in self._ranks_of.get(key, ())}
        return holders, keys

    def of(self, keys: Iterable[str]) -> dict[str, Peer]:
        """The applied peers of ``keys``."""
        return {key: self.peers[key] for key in keys if key in self.peers}

    def at(self, endpoint: str) -> list[Peer]:
        """The applied peers whose endpoint is ``endpoint`` (a doorbell's ringer)."""
        return [self.peers[key] for key in self._at.get(endpoint, ())]

    def applied(self, desired: Mapping[str, Peer], keys: Collection[str] | None) -> None:
        """Record ``desired`` as applied: the peers of ``keys``, or all (None)."""
        if keys is None:
            self.peers, self._at = dict(desired), {}
            for key, peer in self.peers.items():
                self._index(key, peer)
            return
        for key in keys:
            old = self.peers.get(key)
            if old is not None and old.endpoint is not None:
                there = self._at[old.endpoint]
                there.discard(key)
                if not there:
                    del self._at[old.endpoint]
            if key in desired:
                self.peers[key] = desired[key]
                self._index(key, desired[key])
            else:
                self.peers.pop(key, None)

    def _index(self, key: str, peer: Peer) -> None:
        if peer.endpoint is not None:
            self._at.setdefault(peer.endpoint, set()).add(key)


def diff(
    desired: Mapping[str, Peer],
    actual: Mapping[str, DevicePeer | Peer],
    written: Mapping[str, str | None],
    devices: Mapping[str, str] | None = None,
    *,
    pairs: PairRule | None = None,
    awaiting: Collection[str] = (),
    wall: float = 0.0,
) -> Plan:
    """The changes that turn ``actual`` into ``desired``.

    Args:
        desired: from ``desired_peers``.
        actual: the device's peers, keyed by public key.
        written: for each peer, the registry endpoint that was last written
            to the device. An endpoint is written only when the registry's
            value changes, never because the device differs from it: the
            device may have roamed to the peer's real source address behind
            a NAT (invariant 4).
        devices: for each peer, the device id it had when it was last
            written (``devices_after``). A peer on the device whose device id
            has changed since (its wireguard-go was started fresh with the
            same key) is removed and added again in the plan by the side that
            starts the pair's handshakes: that drops the session keys its old
            device had, which the new one does not know, and the plan starts
            a handshake with it at once (``Plan.handshake``). The other side
            leaves it (``Plan.left_restarted``): the restarted device starts a
            handshake with it as soon as it has added it, which replaces the
            stale session.
        pairs: which side of each pair starts its handshakes (invariant 10).
            A peer we initiate with is added with its endpoint, our
            keepalive and a handshake (``Plan.handshake``); one the other
            side initiates with is added without a handshake, and with its
            endpoint held (``Peer.endpoint_held``) while ``pairs.holds_back``:
            its handshake teaches the device the endpoint. ``None``: every
            peer is added with its endpoint and the device's keepalive, and
            restarted peers are re-added (as before the rule).
        awaiting: peers added with their endpoint held that may still wait
            for the other side: while the device has no endpoint for one (no
            handshake from it yet), its endpoint is not written, even if the
            registry's changed (``written_after`` records it as written). One
            that ``pairs`` now says we initiate with (we were not registered
            when we added it) is re-added with its endpoint and a handshake.
        wall: the wall clock, with ``actual`` read from the device: a lazy
            pair's responder whose session is dead (``SESSION_DEAD``) and whose
            device roamed to the initiator's endpoint writes the doorbell back,
            so resumed traffic cannot cross (0: not looked at).

    Returns:
        A plan that removes, updates and adds only what changed.
    """
    remove = [
        Peer(key, peer.allowed_ips, peer.endpoint)
        for key, peer in sorted(actual.items())
        if key not in desired
    ]
    add: list[Peer] = []
    update: list[PeerUpdate] = []
    handshake: list[str] = []
    left: list[Peer] = []
    for key, want in sorted(desired.items()):
        have = actual.get(key)
        eager = pairs is not None and not pairs.lazy(want)
        if have is None:
            add.append(added_peer(want, pairs))
            if eager and pairs is not None and pairs.initiates(want):
                handshake.append(key)
            continue
        waiting = key in awaiting and have.endpoint is None  # no handshake from it yet
        if waiting and pairs is not None and pairs.initiates(want):
            # Held while we were not registered, ours to start now: our entry, taken
            # over with a new key, came after we added it.
            remove.append(Peer(key, tuple(have.allowed_ips), have.endpoint, want.rank))
            add.append(added_peer(want, pairs))
            handshake.append(key)
            continue
        if device_restarted(want, devices or {}):
            if pairs is not None and not eager:
                # A lazy pair: both sides drop the stale session; the first packet
                # starts the next one (the responder's rings the initiator).
                remove.append(Peer(key, tuple(have.allowed_ips), have.endpoint, want.rank))
                add.append(added_peer(want, pairs))
                continue
            if pairs is not None and not pairs.initiates(want):
                left.append(want)
            else:
                remove.append(Peer(key, tuple(have.allowed_ips), have.endpoint, want.rank))
                add.append(added_peer(want, pairs))
                handshake.append(key)
                continue
        endpoint = None if waiting else _endpoint_change(want, have, written)
        if pairs is not None and not eager:
            endpoint = _lazy_endpoint(want, have, pairs, wall, changed=endpoint is not None)
        allowed = want.allowed_ips if tuple(sorted(have.allowed_ips)) != want.allowed_ips else None
        if endpoint is not None or allowed is not None:
            update.append(
                PeerUpdate(key, endpoint, allowed, old_allowed_ips=tuple(have.allowed_ips))
            )
    remove.sort()
    return Plan(
        remove=tuple(remove),
        update=tuple(update),
        add=tuple(add),
        handshake=tuple(handshake),
        left_restarted=tuple(left),
    )


def added_peer(want: Peer, pairs: PairRule | None) -> Peer:
    """``want`` as it is added (and re-added): with the keepalive of its side of the pair, and its
    endpoint held while we wait to be known (``PairRule``)."""
    if pairs is None:
        return want
    if pairs.lazy(want):
        added = want.added_as(pairs.keepalive(want), False)
        endpoint = pairs.device_endpoint(want)
        return added if endpoint == want.endpoint else replace(added, endpoint=endpoint)
    held = pairs.holds_back and not pairs.initiates(want)
    return want.added_as(pairs.keepalive(want), held)


def _lazy_endpoint(
    want: Peer, have: DevicePeer | Peer, pairs: PairRule, wall: float, *, changed: bool
) -> str | None:
    """The endpoint to write for a lazy pair's peer: its side's (``PairRule.device_endpoint``)
    when the registry's changed, or when the device holds the other side's and has no
    session with it: never handshaken (our registration decided the pair after we added
    it), or (``wall`` given) the last handshake older than ``SESSION_DEAD``."""
    target = pairs.device_endpoint(want)
    if changed:
        return target
    if not isinstance(have, DevicePeer) or have.endpoint == target:
        return None
    if have.last_handshake and not (wall and wall - have.last_handshake > SESSION_DEAD):
        return None
    if want.endpoint is None or pairs.spec is None:
        return None
    doorbell = doorbell_endpoint(want.endpoint, pairs.spec.doorbell_port)
    return target if have.endpoint in (want.endpoint, doorbell) else None


def device_restarted(want: Peer, devices: Mapping[str, str]) -> bool:
    """The peer's device id changed since it was written (an unknown id never counts)."""
    before = devices.get(want.public_key, "")
    return bool(before and want.device_id and before != want.device_id)


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


def devices_after(desired: Mapping[str, Peer]) -> dict[str, str]:
    """The ``devices`` map once a plan for ``desired`` has been applied."""
    return {key: peer.device_id for key, peer in desired.items()}
