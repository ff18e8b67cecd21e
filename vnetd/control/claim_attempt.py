"""One attempt at the claim rules for a rank (docs/architecture.md, "Registry layout",
"Claim"): create ``members/<rank>`` if absent; if present and ours (signed by our
signing key, or an unsigned record of an older version with our ``instance``), or
bound to no lease (readers take it for no member), or our own entry overwritten by
another writer, take it over by a compare-and-swap on its mod revision; otherwise it
is held. Each signed record carries a ``seq`` past the last one we wrote and past
the entry it replaces, so readers can refuse an older record of ours put back
(``control.holders.RecordOrder``). ``control.claim`` calls this until it holds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from vnetd.control.membership import (
    BadEntry,
    decode_member,
    describe,
    encode_member,
    member_key,
)
from vnetd.control.proof import Signer
from vnetd.control.rank_cert import CACHE
from vnetd.errors import RegistryError
from vnetd.model import Member
from vnetd.registry.base import KeyValue, Registry
from vnetd.spec import MeshSpec


@dataclass(frozen=True)
class Claimed:
    took_over: bool
    replaced: str = ""
    """What a takeover replaced when it was not our entry as we left it, named for the
    log line (its instance, signing key, lease): a leaseless entry, one not signed by
    our pinned key, our entry overwritten by another writer, an older record of ours."""
    seq: int = field(default=0, compare=False)
    """The ``seq`` of the record written (0: unsigned)."""


@dataclass(frozen=True)
class Held:
    """The rank is held by another instance."""

    holder: Member | None
    entry: KeyValue


@dataclass(frozen=True)
class HeldBy:
    """Who holds the rank while our claim waits, and since when we see it held: what a
    waiting claimant reports (``/status`` ``self.held_by``, a metric, one log line). It
    only reports: a kept-alive lease of a dead holder and a live holder behind a
    partition look the same from here (docs/security.md)."""

    instance: str
    """The holder's instance, or "an unreadable entry"."""
    signing_key: str
    """The first 12 characters of its signing key ("" when unsigned or unreadable)."""
    lease: int
    since: float
    """Wall-clock time this claimant first found the rank held by this entry."""
    holder: str = ""
    """What its rank certificate names (``pod <namespace>/<name> (uid <uid>)``), if any."""

    @classmethod
    def of(cls, held: Held, before: HeldBy | None, now: float, spec: MeshSpec) -> HeldBy:
        """``held`` as a report; ``since`` is kept while the same entry holds the rank."""
        member = held.holder
        instance = member.instance if member is not None else "an unreadable entry"
        key = member.signing_key[:12] if member is not None else ""
        same = before is not None and (before.instance, before.signing_key, before.lease) == (
            instance,
            key,
            held.entry.lease,
        )
        since = before.since if same and before is not None else now
        return cls(instance, key, held.entry.lease, since, _cert_holder(member, spec))

    def entry(self) -> str:
        """``signing key AbC…, lease 7f3a``, for the log line."""
        key = f"signing key {self.signing_key}…, " if self.signing_key else ""
        cert = f", {self.holder}" if self.holder else ""
        return f"{key}lease {self.lease:x}{cert}"

    def as_json(self, now: float) -> dict[str, object]:
        return {
            "instance": self.instance,
            "signing_key": self.signing_key,
            "lease": f"{self.lease:x}",
            "holder": self.holder or None,
            "since": self.since,
            "held_for_s": round(max(0.0, now - self.since), 1),
        }


def _cert_holder(member: Member | None, spec: MeshSpec) -> str:
    """What the holder's certificate names, when the spec pins a rank CA that signed it."""
    if member is None or not member.cert or not spec.rank_ca:
        return ""
    found = CACHE.lookup(member.cert, spec)
    if isinstance(found, str):
        return ""
    if len(found.holder) == 3:
        return f"{found.named} (uid {found.holder[2]})"
    return found.named


def next_seq(after: int) -> int:
    """The ``seq`` of a holder's next record: past ``after`` (the last one it wrote or
    found in its entry) and, across a restart that forgot it, past any it wrote before
    (the wall clock in ns, unless it went back: then the entry read by the claim)."""
    return max(after + 1, time.time_ns())


async def try_claim(
    registry: Registry,
    spec: MeshSpec,
    me: Member,
    lease: int,
    signer: Signer | None = None,
    ours: int = 0,
    after: int = 0,
) -> Claimed | Held:
    """One attempt at the claim rules for ``me.rank`` under ``lease``.

    Args:
        signer: signs the record (its key is ``me.signing_key``); None: unsigned.
        ours: the create revision of an entry readers accepted as ours (0: none):
            found overwritten by another writer, it is written back.
        after: the ``seq`` of the last record we wrote (0: none yet); a signed
            record carries a higher one, and one higher than the entry it replaces.
    """
    key = member_key(spec, me.rank)
    seq = next_seq(after) if signer is not None else 0
    value = encode_member(replace(me, seq=seq), signer, key=key, lease=lease)
    pinned = _PINNED if spec.pinned_key(me.rank) == me.signing_key != "" else (
        _VOUCHED if spec.rank_ca else "")  # fmt: skip
    for _ in range(3):  # a lost compare-and-swap race is retried a few times
        existing = await registry.create(key, value, lease)
        if existing is None:
            return Claimed(took_over=False, seq=seq)
        try:
            holder: Member | None = decode_member(spec, key, existing.value, existing.lease)
        except BadEntry:
            holder = None
        replaced = _replaceable(existing, holder, me, ours, pinned, after)
        if replaced is None:
            return Held(holder, existing)
        if signer is not None and holder is not None and holder.seq >= seq:
            if holder.signing_key == me.signing_key:  # readers order one key's records
                seq = next_seq(holder.seq)  # never below the entry it replaces
                value = encode_member(replace(me, seq=seq), signer, key=key, lease=lease)
        if await registry.replace(key, value, existing.mod_revision, lease):
            return Claimed(took_over=True, replaced=replaced, seq=seq)
    raise RegistryError(f"{key}: claim kept losing compare-and-swap races")


_PINNED = "an entry not signed by the rank's pinned key"
_VOUCHED = "an entry with no rank certificate for its key at this rank"


def _replaceable(
    existing: KeyValue,
    holder: Member | None,
    me: Member,
    ours: int,
    pinned: str = "",
    after: int = 0,
) -> str | None:
    """Why ``me`` may replace ``existing`` ("" for our own entry, as we left it), or
    None: it is held. What is replaced is named (``describe``) for the log line.

    ``pinned`` (what such an entry is): the spec pins our rank to our signing key or
    a rank CA, so an entry readers skip (``_check_pin``, ``rank_cert.refusal``) holds
    nothing either. ``after``: the ``seq`` of our last record; an entry of ours with a
    lower one was put back by a writer."""
    found = f"{describe(holder)}, lease {existing.lease:x}" if existing.lease else ""
    if existing.lease == 0:  # every claim is bound to a lease: this holds nothing
        return f"a leaseless entry ({describe(holder)}, no lease)"
    if pinned and holder is None:  # readers take no entry but the pinned or vouched one
        return f"{pinned} ({found})"
    overwritten = holder is None or holder.signing_key != me.signing_key
    if ours and existing.create_revision == ours and overwritten:
        return f"our entry, overwritten by another writer ({found})"
    if holder is None:
        return None
    if holder.signing_key and holder.signing_key == me.signing_key and holder.seq < after:
        return f"an older record of ours put back ({found}, seq {holder.seq} before {after})"
    if holder.signing_key:
        return "" if holder.signing_key == me.signing_key else None
    return "" if holder.instance == me.instance else None  # an unsigned record
