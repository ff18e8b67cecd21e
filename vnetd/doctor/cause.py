"""One cause for an ordered pair of ranks, from the registry and the daemons' rows.

Pure, and the only place that names a cause: ``classify`` takes what the
doctor gathered (one list of the members, the rows the probe services
answered) and returns one ``Verdict`` per ordered pair. The rules are tried
in the order docs/architecture.md ("Doctor") gives; the first that matches
names the cause, so a fault upstream (a rank that never registered) is not
reported again as its symptoms (no handshake, no data).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from vnetd.doctor.evidence import LAG_LIMIT, SMALL, PeerSeen, Row
from vnetd.errors import REGISTRY_FULL_FIX
from vnetd.model import Member
from vnetd.spec import MeshSpec

OK = "ok"
REGISTRY_FULL = "registry_full"
NOT_REGISTERED = "not_registered"
HELD_SILENT = "held_silent"
CLAIMED_TWICE = "claimed_twice"
KEY_MISMATCH = "key_mismatch"
NOT_ON_DEVICE = "not_on_device"
GATEWAY_HOP = "gateway_hop"
STALE_ENDPOINT = "stale_endpoint"
NO_HANDSHAKE = "no_handshake"
NO_DATA = "no_data"
LOSSY = "lossy"
MTU_BLACK_HOLE = "mtu_black_hole"
NO_ANSWER = "no_answer"
OVERLOADED = "overloaded"

SESSION_LIFETIME = 180.0
"""WireGuard's REJECT_AFTER_TIME (s): an older handshake holds no session."""

CAUSES = (
    REGISTRY_FULL,
    NOT_REGISTERED,
    HELD_SILENT,
    CLAIMED_TWICE,
    KEY_MISMATCH,
    NOT_ON_DEVICE,
    GATEWAY_HOP,
    MTU_BLACK_HOLE,
    OVERLOADED,
    NO_DATA,
    STALE_ENDPOINT,
    LOSSY,
    NO_HANDSHAKE,
    NO_ANSWER,
)
"""Every cause (the JSON's ``cause`` values), in about the order the rules try them, as
docs/operations.md's table lists them (the summary lines group by it)."""


@dataclass(frozen=True)
class Verdict:
    """One ordered pair: ``source`` reaches ``target`` (``cause`` ok) or why not."""

    source: int
    target: int
    cause: str
    detail: str = ""
    via: int | None = None
    """The gateway rank the path goes through; None: direct."""
    rtt: float | None = None
    path_mtu: int | None = None

    @property
    def ok(self) -> bool:
        return self.cause == OK


@dataclass(frozen=True)
class Evidence:
    """Everything one run gathered: the spec, one list of the members, the rows."""

    spec: MeshSpec
    members: Mapping[int, Member]
    rows: Mapping[int, Row]
    registry_full: str | None = None
    """etcd's refusal of a write for space (its NOSPACE alarm), when the doctor's own
    write was refused (``control.write_probe``); None: writes pass, or not asked."""

    def holder_of(self, key: str | None) -> list[int]:
        """The ranks whose entries carry ``key``, lowest first."""
        return list(self._holders.get(key or "", ()))

    @cached_property
    def silent(self) -> dict[int, str]:
        """Rank -> why its live entry looks held by no live daemon (``held_silent``),
        built once for the run."""
        found = {}
        for rank, member in self.members.items():
            detail = _held_silent(self, rank, member)
            if detail:
                found[rank] = detail
        return found

    @cached_property
    def _holders(self) -> dict[str, tuple[int, ...]]:
        """Public key -> its ranks, built once: ``classify`` asks for every ordered pair,
        and a scan of the members each time made a run O(N³) (minutes at 1024 ranks)."""
        holders: dict[str, list[int]] = {}
        for rank in sorted(self.members):
            holders.setdefault(self.members[rank].public_key, []).append(rank)
        return {key: tuple(ranks) for key, ranks in holders.items()}


def classify(evidence: Evidence, source: int, target: int) -> Verdict:
    """The one cause for ``source`` → ``target`` (``OK`` when the echo passed)."""
    members = evidence.members

    def verdict(cause: str, detail: str = "", **extra: object) -> Verdict:
        return Verdict(source, target, cause, detail, **extra)  # type: ignore[arg-type]

    for rank in (source, target):
        if rank not in members and evidence.registry_full is not None:
            return verdict(
                REGISTRY_FULL,
                f"rank {rank} has no entry and cannot claim one: etcd refuses writes for "
                f"space (NOSPACE); {REGISTRY_FULL_FIX}",
            )
        if rank not in members:
            return verdict(NOT_REGISTERED, f"rank {rank} has no entry in the registry")
    for rank in (source, target):
        if rank in evidence.silent:
            return verdict(HELD_SILENT, evidence.silent[rank])
    for rank in (source, target):
        problem = _claim_problem(evidence, rank)
        if problem:
            return verdict(CLAIMED_TWICE, problem)
    for rank in (source, target):
        row = evidence.rows.get(rank)
        if row is not None and row.public_key != members[rank].public_key:
            return verdict(
                KEY_MISMATCH,
                f"rank {rank}'s daemon has key {_short(row.public_key)}, "
                f"the registry has {_short(members[rank].public_key)}",
            )
    row = evidence.rows.get(source)
    seen = row.peers.get(target) if row is not None else None
    via = None
    if seen is not None:
        if seen.key is None:
            return _not_on_device(evidence, source, target)
        holders = [r for r in evidence.holder_of(seen.key) if r != source]
        if not holders:
            return verdict(
                KEY_MISMATCH,
                f"rank {source}'s device holds key {_short(seen.key)} for rank {target}'s "
                f"address, the registry has {_short(members[target].public_key)}",
            )
        if target not in holders:
            via = holders[0]
        if seen.small_rtt is not None:
            if seen.full_rtt is None and (lagged := _lagged(evidence, source, target)):
                return verdict(
                    OVERLOADED, f"64-byte echoes pass, full-size ones were lost; {lagged}"
                )
            return _passed(source, target, seen, row, via)
    if via is not None:
        return _gateway_hop(evidence, source, target, via)
    if seen is None:
        back_row = evidence.rows.get(target)
        back = back_row.peers.get(source) if back_row is not None else None
        if back is not None and back.small_rtt is None:
            # No row from the source: what the target's device says of the way back.
            if back.key is None:
                return _not_on_device(evidence, source, target, seen_by=target)
            holders = [r for r in evidence.holder_of(back.key) if r != target]
            if holders and source not in holders:
                hop = _gateway_hop(evidence, target, source, holders[0])
                return Verdict(source, target, GATEWAY_HOP, f"on the way back: {hop.detail}")
    return _no_echo(evidence, source, target, seen)


def _held_silent(evidence: Evidence, rank: int, member: Member) -> str:
    """Why ``rank``'s live entry looks held by no live daemon, or "".

    No daemon answered the doctor as the entry's instance, and every daemon that
    probed the entry's key got no echo and received nothing from it while probing
    (a live device answers an echo, or at least a keepalive or handshake). A report
    only: a holder behind a partition looks the same (docs/security.md)."""
    row = evidence.rows.get(rank)
    if row is not None and row.instance == member.instance:
        return ""
    probes = [seen for r, other in evidence.rows.items() if r != rank
              if (seen := other.peers.get(rank)) is not None
              and seen.key == member.public_key]  # fmt: skip
    if not probes or any(seen.small_rtt is not None or seen.delivered for seen in probes):
        return ""
    ages = [seen.handshake_age for seen in probes if seen.handshake_age is not None]
    last = "never" if not ages else f"{min(ages):.0f} s ago"
    who = (
        f"its address answers as instance {row.instance!r} (a claimant waiting for the rank?)"
        if row is not None
        else "no daemon answers as it"
    )
    return (
        f"rank {rank}'s entry (instance {member.instance!r}, key {_short(member.public_key)}) "
        f"is live but {len(probes)} daemons probing its key got no echo and received nothing "
        f"from it (last handshake {last}); {who}: its holder may be gone with its lease kept "
        "alive by another client, or cut off by a partition"
        + ("" if ages else f" (never reached: UDP port {evidence.spec.port} to it blocked?)")
    )


def _claim_problem(evidence: Evidence, rank: int) -> str:
    member = evidence.members[rank]
    others = [r for r in evidence.holder_of(member.public_key) if r != rank]
    if others:
        key = _short(member.public_key)
        return f"rank {rank}'s key {key} is also registered by rank {others[0]}"
    row = evidence.rows.get(rank)
    if row is not None and row.instance != member.instance:
        return (
            f"rank {rank}'s address answers as instance {row.instance!r}, "
            f"the registry's rank {rank} is {member.instance!r}"
        )
    return ""


def _passed(source: int, target: int, seen: PeerSeen, row: Row | None, via: int | None) -> Verdict:
    if seen.full_rtt is not None:
        mtu = row.mtu if row is not None else None
        return Verdict(source, target, OK, "", via, seen.small_rtt, mtu)
    largest = seen.largest or 0
    return Verdict(
        source,
        target,
        MTU_BLACK_HOLE,
        f"{largest}-byte packets pass, {row.mtu if row else 'full'}-byte ones do not "
        "(DF set both ways, no ICMP back)",
        via,
        seen.small_rtt,
        largest,
    )


def _not_on_device(
    evidence: Evidence, source: int, target: int, seen_by: int | None = None
) -> Verdict:
    """No peer holds the address: a site whose gateways are all gone, or a lagging device."""
    spec = evidence.spec
    sites = {evidence.members[source].site, evidence.members[target].site}
    for name, ranks in spec.gateways:
        if name in sites and not {source, target} & set(ranks):
            if not any(r in evidence.members for r in ranks):
                return Verdict(
                    source,
                    target,
                    GATEWAY_HOP,
                    f"no gateway of site {name!r} (ranks {list(ranks)}) is registered",
                )
    holder = source if seen_by is None else seen_by
    other = target if holder == source else source
    return Verdict(
        source,
        target,
        NOT_ON_DEVICE,
        f"rank {holder}'s device has no peer for rank {other}'s address",
    )


def _gateway_hop(evidence: Evidence, source: int, target: int, via: int) -> Verdict:
    first = evidence.rows[source].peers.get(via) if source in evidence.rows else None
    if first is None or first.small_rtt is None:
        hop = f"rank {source} → gateway {via} fails ({_device_text(first)})"
    else:
        gateway = evidence.rows.get(via)
        second = gateway.peers.get(target) if gateway is not None else None
        if gateway is None:
            hop = f"gateway {via} does not answer; rank {source} → gateway {via} passes"
        elif second is not None and second.key is None:
            why = _not_on_device(evidence, via, target, seen_by=via).detail
            hop = f"gateway {via} → rank {target} fails: {why}"
        elif second is None or second.small_rtt is None:
            hop = f"gateway {via} → rank {target} fails ({_device_text(second)})"
        else:
            hop = f"both hops pass alone (rank {source} → {via} → {target}); the forward fails"
    return Verdict(source, target, GATEWAY_HOP, hop, via)


def _no_echo(evidence: Evidence, source: int, target: int, seen: PeerSeen | None) -> Verdict:
    back_row = evidence.rows.get(target)
    back = back_row.peers.get(source) if back_row is not None else None
    if seen is None and back is None:
        return Verdict(source, target, NO_ANSWER, "neither daemon's probe service answered")
    if seen is None and back is not None and back.small_rtt is not None:
        return Verdict(
            source,
            target,
            NO_ANSWER,
            f"rank {source}'s probe service did not answer; rank {target} reaches it",
        )
    lagged = _lagged(evidence, source, target)
    if lagged and not (seen is not None and seen.key and seen.handshake_age is None):
        return Verdict(source, target, OVERLOADED, f"no echo passed; {lagged}")
    dropped = (
        _outbound_dropped(evidence, source, target)
        or _outbound_dropped(evidence, target, source)
        or _inner_dropped(evidence, source, target)
        or _inner_dropped(evidence, target, source)
    )
    if dropped:
        return Verdict(source, target, NO_DATA, dropped)
    stale = _stale(evidence, source, target, seen) or _stale(evidence, target, source, back)
    if stale:
        return Verdict(source, target, STALE_ENDPOINT, stale)
    lossy = _lossy(source, target, seen, back)
    if lossy:
        return Verdict(source, target, LOSSY, lossy)
    return Verdict(
        source,
        target,
        NO_HANDSHAKE,
        f"{_blocked(evidence, source, target, seen, back)}rank {source}'s device: "
        f"{_device_text(seen)}; rank {target}'s device: {_device_text(back)}",
    )


def _blocked(ev: Evidence, a: int, b: int, seen: PeerSeen | None, back: PeerSeen | None) -> str:
    """The "UDP blocked" prefix when no device that answered holds a session with the other (the
    handshake is one datagram each way: with both on the devices, they do not pass)."""
    if any(s is not None and s.handshake_age is not None and s.handshake_age < SESSION_LIFETIME
           for s in (seen, back)):  # fmt: skip
        return ""
    return (f"UDP blocked: no WireGuard handshake completes between ranks {a} and {b}: UDP port "
            f"{ev.spec.port} between their pods is dropped (a NetworkPolicy, a firewall, the "
            "CNI) or a NAT has no forwarded port; ")  # fmt: skip


def _lagged(evidence: Evidence, source: int, target: int) -> str:
    """Why the echoes of ``source`` → ``target`` are no evidence, or "": the event loop
    of a daemon that sent or answered them ran more than ``LAG_LIMIT`` late meanwhile."""
    for holder, peer in ((source, target), (target, source)):
        row = evidence.rows.get(holder)
        seen = row.peers.get(peer) if row is not None else None
        if seen is not None and seen.lag > LAG_LIMIT:
            return (
                f"rank {holder}'s daemon was overloaded while probing (its event loop ran "
                f"{seen.lag:.1f} s late): not evidence of a network fault, run again"
            )
    return ""


def _inner_dropped(evidence: Evidence, sender: int, at: int) -> str:
    """Why inner packets from ``sender`` are dropped in ``at``'s pod, or "".

    The tunnel carries them: ``at``'s device completed a session with ``sender`` and
    received at least ``SMALL`` bytes from it while probing. Yet none reached a socket
    of ``at``'s: its service received no echo from ``sender`` and its own echoes got no
    answer. Bytes that arrive and are decrypted reach one of the two unless something
    in the pod drops them; under mere loss, what arrives reaches its socket (and what
    did not arrive is not in the device's count)."""
    row = evidence.rows.get(at)
    seen = row.peers.get(sender) if row is not None else None
    if seen is None or not _carries(seen) or seen.small_rtt is not None or seen.echoed:
        return ""
    return (
        f"rank {at}'s device received {seen.delivered} B from rank {sender} while probing, "
        f"but no echo or answer from it reached rank {at}'s sockets: inner traffic from "
        f"rank {sender} is dropped in rank {at}'s pod"
    )


def _outbound_dropped(evidence: Evidence, at: int, peer: int) -> str:
    """Why inner packets from ``at`` to ``peer`` are dropped in ``at``'s pod on their way
    out, or "".

    ``at``'s probe wrote at least ``SMALL`` bytes of echoes to ``peer``, none came back,
    and a session with ``peer`` is up (so the device sends what it is given at once),
    yet the device sent fewer bytes to ``peer`` than the echoes alone would have made
    (each leaves it as its size plus 32 or more). Loss on the underlay happens after
    the device's count; only something between this pod's sockets and its device (a
    firewall rule on the overlay interface, a qdisc) keeps them from it. Tried before
    ``_inner_dropped``: the few handshake and keepalive bytes such a pod still sends
    its peer must not name the peer's pod."""
    row = evidence.rows.get(at)
    seen = row.peers.get(peer) if row is not None else None
    if seen is None or seen.small_rtt is not None or seen.written < SMALL:
        return ""
    age = seen.handshake_age
    if age is None or age >= SESSION_LIFETIME or seen.sent >= seen.written:
        return ""
    return (
        f"rank {at}'s probe wrote {seen.written} B of echoes to rank {peer} while probing, "
        f"but its device sent only {seen.sent} B to it (a session is up): inner traffic "
        f"to rank {peer} is dropped in rank {at}'s pod, on its way out to "
        f"{evidence.spec.interface}"
    )


def _lossy(source: int, target: int, seen: PeerSeen | None, back: PeerSeen | None) -> str:
    """Why the echoes are lost on a tunnel that works, or "": the target's service
    received some of them, or a session is up and nothing of the echoes came back."""
    if back is not None and back.echoed:
        return (
            f"rank {target}'s service received {back.echoed} echoes from rank {source} and "
            f"answered them, but no answer came back: the path loses packets"
        )
    age = seen.handshake_age if seen is not None else None
    if age is not None and age < SESSION_LIFETIME:
        return (
            f"a session is up (handshake {age:.0f} s ago) but none of rank {source}'s "
            f"echoes came back: the path loses packets ({_device_text(seen)})"
        )
    return ""


def _carries(seen: PeerSeen) -> bool:
    """A session is up (handshake completed within WireGuard's 180 s) and carried data."""
    age = seen.handshake_age
    return age is not None and age < SESSION_LIFETIME and seen.delivered >= SMALL


def _stale(evidence: Evidence, holder: int, peer: int, seen: PeerSeen | None) -> str:
    """Why ``holder``'s device endpoint for ``peer`` is stale, or ""."""
    if seen is None or seen.endpoint is None:
        return ""
    members = evidence.members
    registered = members[peer].endpoint_from(members[holder].site)
    if registered is None or registered == seen.endpoint:
        return ""
    return (
        f"rank {holder}'s device sends to rank {peer} at {seen.endpoint}, "
        f"the registry has {registered}; nothing arrives from it"
    )


def _device_text(seen: PeerSeen | None) -> str:
    if seen is None:
        return "no answer"
    handshake = "never" if seen.handshake_age is None else f"{seen.handshake_age:.0f} s ago"
    return (
        f"endpoint {seen.endpoint or 'none'}, last handshake {handshake}, "
        f"rx {seen.rx_bytes} B, tx {seen.tx_bytes} B"
    )


def _short(key: str | None) -> str:
    return "none" if key is None else key[:8] + "…"
