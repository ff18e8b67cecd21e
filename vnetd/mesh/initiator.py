"""One initiator per pair (invariant 10): who starts a pair's handshake, and the watch on it.

``PairRule`` decides, the same way on both sides, which side of a pair starts
its handshakes: the side that can reach the other when only one can (it has
an endpoint for its peer), else the earlier registration (the lower create
revision, ties by public key). ``HandshakeWatch`` keeps the few peers whose
first handshake is still due: the initiator's, retried by re-adding the peer
when it has not completed within ``RETRY_AFTER`` (``EARLY_CHECK`` for a peer
that registered just after we joined, which may not hold us yet; only if we
have an endpoint for it); and the responder's, waiting for the
initiator, whose endpoint is written after ``FALLBACK_AFTER`` if it never
came (our own packets for it then start a handshake). Pure: times are
passed in. The rule, and what was verified in wireguard-go and the kernel,
is in docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vnetd.mesh.eager import doorbell_endpoint, eager_pair
from vnetd.model import DevicePeer, Member, Peer, PeerUpdate, Plan
from vnetd.spec import MeshSpec

RETRY_AFTER = 1.0
"""Seconds the initiator gives a handshake before re-adding the peer and starting another."""
RETRIES = 3
"""Re-adds after the first try; then WireGuard's own retry (every 5 s) is left to it."""
EARLY_CHECK = 0.4
"""Seconds the initiator gives its first handshake with a peer that registered within
``RACE_WINDOW`` after we joined. Such a peer may have listed the members before our
registration and learn of us only from its watch, after ours delivered it: our first
initiation then reaches a device that does not hold us yet and is dropped ("Received
invalid initiation message" in wireguard-go's verbose log). Traced in the lab (24 and 64
pods, 2 loaded cores): the peer added us 0.2-0.3 s after our initiation left."""
RACE_WINDOW = 2.0
"""How long after we joined a peer we initiate with gets ``EARLY_CHECK``."""
FALLBACK_AFTER = 2.0
"""Seconds a responder waits for the initiator (once registered) before writing its endpoint."""
RING_SETTLE = 0.25
"""Seconds after a ring's handshake before the peer is re-added with another: the ring
starts one on the peer as it is, which wireguard-go skips when it sent one within 5 s (our
own first packet's, under way or lost); a lost one is replaced after this, not in 5 s."""
READ_SPACING = 0.05
"""Seconds at least between two device reads of the handshake watch (``check``): the rings,
retries and fallbacks that come due in between wait for the next read and share it."""
READ_SHARE = 0.1
"""At most this share of a core goes to the handshake watch's device reads: they are
spaced by a read's cost over it when that is more than ``READ_SPACING``, up to
``MAX_READ_SPACING``, so a flood of forged rings for peers we hold (each ring's check,
then its settle and retries) costs at most this, and a true ring waits a fraction of a
second."""
READ_COST_PER_PEER = 5e-6
"""A device read's CPU per peer (s), an estimate: tens of ms for wireguard-go's 10,000
(its UAPI text, parsed). The cost is counted from the peers read, not timed: a read's
wall time on a loaded host is the host's, and spacing by it delayed every retry."""
MAX_READ_SPACING = 0.5
"""The most the reads are spaced, whatever the device's size."""
STRAY_MEMORY = 5.0
"""Seconds a ring taken for a stray (we hold a live session) is remembered: if the peer is
re-added within them (its WireGuard restarted, so that session is gone on its side, and
its new ``device_id`` reached us after its first packet rang), the ring is answered then,
not at its WireGuard's next retry 5 s later. Only a ring that comes when the session is
older than this: one that comes as the session starts is the other side's first packet
crossing ours (both sent at once), already answered by that session."""
SESSION_FRESH = 170.0
"""A ring for a peer we handshook with within this many seconds (wall clock) is answered
only once that session is older: below WireGuard's 180 s key expiry, after which the
responder, finding no keys, rings again."""
SESSION_DEAD = 190.0
"""Seconds after its last handshake a lazy pair's session is surely dead on both sides:
WireGuard's keys expire at 180 s (a session in use is renewed before: at 120 s by its
initiator, at 165 s when only the responder sends). The responder then holds the
doorbell again (``peers.diff``), so traffic resuming on both sides cannot cross."""
IDLE_KEEPALIVE = 25
"""The initiator's persistent keepalive (s): below the 60 s between WireGuard's rekey
(120 s) and its key expiry (180 s), so an idle session is always renewed from the
initiator's side and never lapses into two sides initiating at once."""


@dataclass(frozen=True)
class PairRule:
    """Which side of each pair starts the handshakes, from this rank's view.

    Attributes:
        self_key: our public key.
        registered: our own entry is in the view (we have claimed our rank).
            Before that no member knows us, so an initiation of ours would be
            dropped: every peer waits for the other side.
        joining: our entry was created after this process first listed the
            members (a join, where every member learns of us from the
            registry and then starts the handshake), not taken over from a
            previous process of this pod (whose peers know us already).
        self_created: our entry's create revision (``None``: not known).
        created: rank -> create revision of each member (``MemberView.created``).
        spec_keepalive: the spec's ``persistent_keepalive`` (0: none).
        self_member: our own entry as registered (``None``: not known).
        members: rank -> each member's entry (``MemberView.members``): which
            side of a pair has an endpoint for the other, in the scope it
            would use (``Member.endpoint_from``).
        spec: the mesh's spec, whose ``tree_fanout`` makes pairs lazy
            (``mesh.eager``); None: every pair is eager.
        self_rank: our rank (with ``spec``).
    """

    self_key: str
    registered: bool
    self_created: int | None
    created: Mapping[int, int]
    spec_keepalive: int = 0
    joining: bool = True
    self_member: Member | None = None
    members: Mapping[int, Member] = field(default_factory=dict)
    spec: MeshSpec | None = None
    self_rank: int | None = None

    def lazy(self, peer: Peer) -> bool:
        """The pair handshakes on its first packet, not when it is added (``mesh.eager``)."""
        spec = self.spec
        if spec is None or not spec.tree_fanout or peer.rank is None or self.self_rank is None:
            return False
        theirs = self.members.get(peer.rank)
        if theirs is None or not theirs.device_id:
            return False  # a plain WireGuard host (``vnetd register``): no doorbell to ring
        same_site = theirs.site == spec.site.name
        return not eager_pair(spec, self.self_rank, peer.rank, same_site=same_site)

    def device_endpoint(self, peer: Peer) -> str | None:
        """The endpoint ``peer`` is written with: a lazy pair's responder writes the
        initiator's doorbell, so its first packet rings the initiator's daemon, which
        starts the handshake (a lazy pair keeps one initiator too: invariant 10)."""
        if peer.endpoint is None or self.spec is None or not self.lazy(peer):
            return peer.endpoint
        if self.initiates(peer):
            return peer.endpoint
        return doorbell_endpoint(peer.endpoint, self.spec.doorbell_port)

    def initiates(self, peer: Peer) -> bool:
        """We start the handshakes with ``peer``: we alone can reach it, or both or
        neither can and our registration is the earlier one."""
        if not self.registered:
            return False
        reach = self.reaches(peer)
        if reach is not None:
            return reach
        theirs = self.created.get(peer.rank, math.inf) if peer.rank is not None else math.inf
        ours = math.inf if self.self_created is None else self.self_created
        return (ours, self.self_key) < (theirs, peer.public_key)

    def reaches(self, peer: Peer) -> bool | None:
        """Whether we alone (True) or ``peer`` alone (False) has an endpoint for the
        other, each in the scope it would use, from the two registry entries (so
        both sides compute the same answer); None when both or neither do, or
        either entry is unknown."""
        theirs = self.members.get(peer.rank) if peer.rank is not None else None
        if theirs is None or self.self_member is None:
            return None
        ours_for_them = theirs.endpoint_from(self.self_member.site) is not None
        theirs_for_us = self.self_member.endpoint_from(theirs.site) is not None
        return ours_for_them if ours_for_them != theirs_for_us else None

    def keepalive(self, peer: Peer) -> int:
        """The persistent keepalive (s) for ``peer``: its own (a peer in another site
        keeps NAT mappings open), else the spec's, on both sides (a NAT needs both);
        at most ``IDLE_KEEPALIVE`` on the initiator's."""
        own = self.spec_keepalive if peer.keepalive is None else peer.keepalive
        if not self.initiates(peer) or self.lazy(peer):
            return own
        return min(own or IDLE_KEEPALIVE, IDLE_KEEPALIVE)

    @property
    def holds_back(self) -> bool:
        """A new peer that starts the handshakes is added with its endpoint held: it
        learns of us (or has just learned) from the registry and then initiates;
        an initiation of ours would cross its own or be dropped. A daemon that
        took its entry over adds peers with their endpoints: they know it already,
        and re-add it once its new device id is registered."""
        return not self.registered or self.joining


@dataclass
class _Due:
    peer: Peer  # as it should be on the device, endpoint included
    deadline: float
    tries: int = 0
    wait: float = RETRY_AFTER  # how long this try was given


@dataclass
class Checked:
    """What a check of the watched peers found (``HandshakeWatch.check``)."""

    plan: Plan = field(default_factory=Plan)
    """Re-adds with a handshake (initiators retrying) and endpoint updates (responders
    falling back)."""
    retried: list[tuple[Peer, int, float]] = field(default_factory=list)
    """Peers re-added by the initiator, with the try number (2 for the first retry) and
    how long the failed try was given."""
    fallbacks: list[Peer] = field(default_factory=list)
    """Peers whose initiator never came: their endpoint is written, so our own packets
    for them start a handshake (and none is sent when we have nothing to send)."""
    given_up: list[Peer] = field(default_factory=list)
    """Peers still without a handshake after every retry."""
    answered: list[Peer] = field(default_factory=list)
    """Peers that rang our doorbell (a lazy pair's responder sending first): a handshake
    started on each, as it is on the device (``Plan.handshake`` without a re-add)."""


class HandshakeWatch:
    """The peers whose first handshake is due, and when to look at them next.

    ``initiating``: peers we started a handshake with (``Plan.handshake``).
    ``awaiting``: peers added with their endpoint held, waiting for the
    initiator; their clock starts once we are registered.
    """

    def __init__(self) -> None:
        self.initiating: dict[str, _Due] = {}
        self.awaiting: dict[str, _Due] = {}
        self.rung: dict[str, _Due] = {}
        """Lazy peers whose responder rang our doorbell: ours to start, at ``deadline``."""
        self.strays: dict[str, float] = {}
        """Rung peers found with a live session, and when (``STRAY_MEMORY``)."""
        self.read_spacing = READ_SPACING
        """Seconds from one device read of ``check`` to the next (``read_took``)."""
        self._read_at = -math.inf
        self.registered_at: float | None = None
        self.joined_at: float | None = None
        """When we registered after a pass had found us unregistered (a join in this
        process, not an entry taken over at start); None otherwise."""
        self._unregistered_seen = False

    def note(self, plan: Plan, wanted: Mapping[str, Peer], now: float) -> None:
        """Record an applied ``plan``; ``wanted`` maps keys to the desired peers (those
        of the pass: a watched peer in it is re-added, if it comes to that, as it is
        wanted now, at its current endpoint)."""
        for peer in plan.remove:
            self.initiating.pop(peer.public_key, None)
            self.awaiting.pop(peer.public_key, None)
        for table in (self.initiating, self.awaiting, self.rung):
            # O(the smaller side): a pass over one change must not walk a join's
            # thousand watched peers, nor a full pass's thousand peers a few watched.
            keys = table.keys() & wanted.keys() if len(table) < len(wanted) else wanted
            for key in keys:
                due = table.get(key)
                if due is None:
                    continue
                want = wanted[key]
                if (due.peer.endpoint, due.peer.allowed_ips) != (want.endpoint, want.allowed_ips):
                    due.peer = replace(
                        due.peer, endpoint=want.endpoint, allowed_ips=want.allowed_ips
                    )
        started = set(plan.handshake)
        joined = self.joined_at is not None and now - self.joined_at <= RACE_WINDOW
        first = EARLY_CHECK if joined else RETRY_AFTER
        for peer in plan.add:
            key = peer.public_key
            stray = self.strays.pop(key, None)
            if stray is not None and now - stray < STRAY_MEMORY and key not in started:
                self.rung[key] = _Due(peer, now)  # re-added after its ring: answered now
            if key in started and peer.endpoint is not None:
                # Without an endpoint a re-add could send nothing: the peer reaches us.
                self.initiating[key] = _Due(peer, now + first, wait=first)
            elif peer.endpoint_held and peer.endpoint is not None:
                self.awaiting[key] = _Due(replace(peer, endpoint_held=False), now + FALLBACK_AFTER)

    def ring(self, peer: Peer, now: float) -> None:
        """``peer`` (as it is on the device) rang our doorbell: start its handshake."""
        if peer.public_key not in self.initiating:
            self.rung.setdefault(peer.public_key, _Due(peer, now))

    def read_took(self, peers: int) -> None:
        """A device read returned ``peers`` peers: space the reads of ``check`` by its cost."""
        cost = peers * READ_COST_PER_PEER / READ_SHARE
        self.read_spacing = min(MAX_READ_SPACING, max(READ_SPACING, cost))

    def failed(self, found: Checked, now: float) -> None:
        """The plan of ``found`` was not applied: its fallbacks are due again at once
        (a retried initiation is watched still, and the next full pass repairs the device)."""
        for peer in found.fallbacks:
            self.awaiting[peer.public_key] = _Due(peer, now)

    def registered(self, now: float) -> None:
        """We are registered: from now on the initiators can know us."""
        if self.registered_at is None:
            self.registered_at = now
            if self._unregistered_seen:
                self.joined_at = now

    def unregistered(self) -> None:
        self.registered_at = None
        self.joined_at = None
        self._unregistered_seen = True

    def next_check(self) -> float:
        """When a watched peer is next due, but not within ``read_spacing`` of the last
        check (``inf``: none is)."""
        due = [d.deadline for d in (*self.initiating.values(), *self.rung.values())]
        if self.registered_at is not None:
            due += [self._fallback_at(d) for d in self.awaiting.values()]
        return max(min(due, default=math.inf), self._read_at + self.read_spacing)

    def _fallback_at(self, due: _Due) -> float:
        assert self.registered_at is not None
        return max(due.deadline, self.registered_at + FALLBACK_AFTER)

    def check(self, device: Mapping[str, DevicePeer], now: float, wall: float = 0.0) -> Checked:
        """Settle the watched peers against ``device``: those with a handshake are done;
        of those due without one, an initiator's are re-added with a handshake (or
        given up), a responder's get their endpoint, a ringer without a session gets a
        handshake (``wall``: the wall clock, which the device's handshake times use)."""
        found = Checked()
        remove: list[Peer] = []
        add: list[Peer] = []
        update: list[PeerUpdate] = []
        kick: list[str] = []
        self._read_at = now
        if self.strays:
            self.strays = {k: t for k, t in self.strays.items() if now - t < STRAY_MEMORY}
        for key, due in list(self.rung.items()):
            have = device.get(key)
            del self.rung[key]
            if have is None or wall - have.last_handshake < SESSION_FRESH:
                # Gone, or a live session: a stray ring (one sent before that session, or
                # by a peer whose WireGuard restarted: remembered for its re-add).
                if have is not None and wall - have.last_handshake >= STRAY_MEMORY:
                    self.strays[key] = now
                continue
            # Started on the peer as it is: a no-op in wireguard-go when ours is under way
            # (both sides' first packets at once), which a re-add would drop.
            self.initiating[key] = _Due(due.peer, now + RING_SETTLE, wait=RING_SETTLE)
            found.answered.append(due.peer)
            kick.append(key)
        for key, due in list(self.initiating.items()):
            have = device.get(key)
            if have is None or have.last_handshake:
                del self.initiating[key]
            elif due.deadline <= now:
                if due.tries >= RETRIES:
                    del self.initiating[key]
                    found.given_up.append(due.peer)
                    continue
                due.tries += 1
                found.retried.append((due.peer, due.tries + 1, due.wait))
                due.deadline, due.wait = now + RETRY_AFTER, RETRY_AFTER
                remove.append(_as_removed(have, due.peer))
                add.append(due.peer)
        for key, due in list(self.awaiting.items()):
            have = device.get(key)
            if have is None or have.last_handshake or have.endpoint is not None:
                del self.awaiting[key]  # the initiator's handshake came (or is under way)
            elif self.registered_at is not None and self._fallback_at(due) <= now:
                del self.awaiting[key]
                update.append(PeerUpdate(key, due.peer.endpoint))
                found.fallbacks.append(due.peer)
        found.plan = Plan(
            remove=tuple(sorted(remove)),
            update=tuple(update),
            add=tuple(add),
            handshake=(*(peer.public_key for peer in add), *kick),
        )
        return found


def _as_removed(have: DevicePeer, want: Peer) -> Peer:
    return Peer(have.public_key, tuple(have.allowed_ips), have.endpoint, want.rank)
