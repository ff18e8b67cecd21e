"""One initiator per pair (invariant 10): who starts a pair's handshake, and the watch on it.

``PairRule`` decides, the same way on both sides, which side of a pair starts
its handshakes: the earlier registration (the lower create revision, ties by
public key). ``HandshakeWatch`` keeps the few peers whose first handshake is
still due: the initiator's, retried by re-adding the peer when it has not
completed within ``RETRY_AFTER``; and the responder's, waiting for the
initiator, whose endpoint is written after ``FALLBACK_AFTER`` if it never
came (our own packets for it then start a handshake). Pure: times are
passed in. The rule, and what was verified in wireguard-go and the kernel,
is in docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vnetd.model import DevicePeer, Peer, PeerUpdate, Plan

RETRY_AFTER = 1.0
"""Seconds the initiator gives a handshake before re-adding the peer and starting another."""
RETRIES = 3
"""Re-adds after the first try; then WireGuard's own retry (every 5 s) is left to it."""
FALLBACK_AFTER = 2.0
"""Seconds a responder waits for the initiator (once registered) before writing its endpoint."""
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
    """

    self_key: str
    registered: bool
    self_created: int | None
    created: Mapping[int, int]
    spec_keepalive: int = 0
    joining: bool = True

    def initiates(self, peer: Peer) -> bool:
        """We start the handshakes with ``peer``: our registration is the earlier one."""
        if not self.registered:
            return False
        theirs = self.created.get(peer.rank, math.inf) if peer.rank is not None else math.inf
        ours = math.inf if self.self_created is None else self.self_created
        return (ours, self.self_key) < (theirs, peer.public_key)

    def keepalive(self, peer: Peer) -> int:
        """The persistent keepalive (s) for ``peer``: its own (a peer in another site
        keeps NAT mappings open), else the spec's, on both sides (a NAT needs both);
        at most ``IDLE_KEEPALIVE`` on the initiator's."""
        own = self.spec_keepalive if peer.keepalive is None else peer.keepalive
        if not self.initiates(peer):
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


@dataclass
class Checked:
    """What a check of the watched peers found (``HandshakeWatch.check``)."""

    plan: Plan = field(default_factory=Plan)
    """Re-adds with a handshake (initiators retrying) and endpoint updates (responders
    falling back)."""
    retried: list[tuple[Peer, int]] = field(default_factory=list)
    """Peers re-added by the initiator, with the try number (2 for the first retry)."""
    fallbacks: list[Peer] = field(default_factory=list)
    """Peers whose initiator never came: their endpoint is written, so our own packets
    for them start a handshake (and none is sent when we have nothing to send)."""
    given_up: list[Peer] = field(default_factory=list)
    """Peers still without a handshake after every retry."""


class HandshakeWatch:
    """The peers whose first handshake is due, and when to look at them next.

    ``initiating``: peers we started a handshake with (``Plan.handshake``).
    ``awaiting``: peers added with their endpoint held, waiting for the
    initiator; their clock starts once we are registered.
    """

    def __init__(self) -> None:
        self.initiating: dict[str, _Due] = {}
        self.awaiting: dict[str, _Due] = {}
        self.registered_at: float | None = None

    def note(self, plan: Plan, wanted: Mapping[str, Peer], now: float) -> None:
        """Record an applied ``plan``; ``wanted`` maps keys to the desired peers (those
        of the pass: a watched peer in it is re-added, if it comes to that, as it is
        wanted now, at its current endpoint)."""
        for peer in plan.remove:
            self.initiating.pop(peer.public_key, None)
            self.awaiting.pop(peer.public_key, None)
        for table in (self.initiating, self.awaiting):
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
        for peer in plan.add:
            key = peer.public_key
            if key in started:
                self.initiating[key] = _Due(peer, now + RETRY_AFTER)
            elif peer.endpoint_held and peer.endpoint is not None:
                self.awaiting[key] = _Due(replace(peer, endpoint_held=False), now + FALLBACK_AFTER)

    def failed(self, found: Checked, now: float) -> None:
        """The plan of ``found`` was not applied: its fallbacks are due again at once
        (a retried initiation is watched still, and the next full pass repairs the device)."""
        for peer in found.fallbacks:
            self.awaiting[peer.public_key] = _Due(peer, now)

    def registered(self, now: float) -> None:
        """We are registered: from now on the initiators can know us."""
        if self.registered_at is None:
            self.registered_at = now

    def unregistered(self) -> None:
        self.registered_at = None

    def next_check(self) -> float:
        """When a watched peer is next due (``inf``: none is)."""
        due = [d.deadline for d in self.initiating.values()]
        if self.registered_at is not None:
            due += [self._fallback_at(d) for d in self.awaiting.values()]
        return min(due, default=math.inf)

    def _fallback_at(self, due: _Due) -> float:
        assert self.registered_at is not None
        return max(due.deadline, self.registered_at + FALLBACK_AFTER)

    def check(self, device: Mapping[str, DevicePeer], now: float) -> Checked:
        """Settle the watched peers against ``device``: those with a handshake are done;
        of those due without one, an initiator's are re-added with a handshake (or
        given up), a responder's get their endpoint."""
        found = Checked()
        remove: list[Peer] = []
        add: list[Peer] = []
        update: list[PeerUpdate] = []
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
                due.deadline = now + RETRY_AFTER
                remove.append(_as_removed(have, due.peer))
                add.append(due.peer)
                found.retried.append((due.peer, due.tries + 1))
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
            handshake=tuple(peer.public_key for peer in add),
        )
        return found


def _as_removed(have: DevicePeer, want: Peer) -> Peer:
    return Peer(have.public_key, tuple(have.allowed_ips), have.endpoint, want.rank)
