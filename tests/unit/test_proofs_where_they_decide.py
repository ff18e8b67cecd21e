"""Proofs where they decide (docs/architecture.md, "Proofs"): a reader verifies a
record's proof when it would change who holds an entry or a key, and takes a first
claim that decides nothing unverified (but in a mesh read through relays); a watch batch is reduced to the last event per
key before decoding. A forged record is still refused wherever it would decide.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest
from shared import byte_key as key

from vnetd.control import membership, rank_cert
from vnetd.control.member_view import MemberView
from vnetd.control.membership import encode_member, member_key
from vnetd.control.proof import Signer
from vnetd.control.watch_batch import last_per_key
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.spec import MeshSpec, parse_spec

VICTIM = Signer.generate()
THIEF = Signer.generate()
CA = Signer.generate()
NET = {"name": "m", "size": 8, "network": "10.250.0.0/16"}
PLAIN = parse_spec({"mesh": NET, "registry": {"lease_ttl": 6}})
RANK_CA = parse_spec({"mesh": {**NET, "rank_ca": [CA.public_key]}})
RELAYED = parse_spec({"mesh": NET, "registry": {"relays": ["http://198.18.0.20:2381"]}})
PINNED = parse_spec(
    {"mesh": NET, "sites": {"b": {"gateways": [2], "gateway_keys": {"2": VICTIM.public_key}}}}
)


def member(rank: int, wg: int, signer: Signer, seq: int = 1, cert: str = "") -> Member:
    return Member(rank, key(wg), f"198.18.0.{wg}:51820", f"pod{wg}", 100.0, "1.0",
                  signing_key=signer.public_key, seq=seq, cert=cert)  # fmt: skip


def record(spec: MeshSpec, m: Member, signer: Signer, lease: int = 7) -> bytes:
    return encode_member(m, signer, key=member_key(spec, m.rank), lease=lease)


def forged(spec: MeshSpec, m: Member, named: Signer, lease: int = 7) -> bytes:
    """``m`` signed by the thief but naming ``named``'s signing key: its proof fails."""
    value = json.loads(record(spec, replace(m, signing_key=THIEF.public_key), THIEF, lease))
    value["signing_key"] = named.public_key
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def moved(spec: MeshSpec, m: Member, signer: Signer) -> bytes:
    """``m``'s genuine record with its endpoint changed after signing (a relay's forgery)."""
    value = json.loads(record(spec, m, signer))
    value["endpoint"] = "198.18.9.9:51820"
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def put(
    spec: MeshSpec, rank: int, value: bytes, mod: int, create: int, lease: int = 7
) -> WatchEvent:
    return WatchEvent("put", member_key(spec, rank), value, mod, create, lease)


def delete(spec: MeshSpec, rank: int, mod: int) -> WatchEvent:
    return WatchEvent("delete", member_key(spec, rank), b"", mod)


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The proofs verified, by signing key (counted, not timed)."""
    calls: list[str] = []
    real = membership.verify

    def counting(signing_key: str, *args: object) -> bool:
        calls.append(signing_key)
        return real(signing_key, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(membership, "verify", counting)
    return calls


def holding(spec: MeshSpec, *members: tuple[Member, Signer]) -> MemberView:
    """A view that listed ``members`` (a list verifies every proof)."""
    view = MemberView()
    kvs = [KeyValue(member_key(spec, m.rank), record(spec, m, s), 5 + i, 5 + i, 7)
           for i, (m, s) in enumerate(members)]  # fmt: skip
    view.replace(spec, kvs, 10)
    assert set(view.members) == {m.rank for m, _ in members} and not view.unproven
    return view


HELD = member(1, 1, VICTIM, seq=5)
CERT3 = base64.b64encode(
    rank_cert.issue(CA, VICTIM.public_key, rank_cert.rank_uri("m", 3), days=1)
).decode()


# Each forgery, and the view it meets: a record that would decide is verified and refused.
@pytest.mark.parametrize(
    ("spec", "before", "event", "why"),
    [
        pytest.param(PLAIN, [(HELD, VICTIM)], put(PLAIN, 3, forged(PLAIN, member(3, 9, VICTIM), VICTIM), 20, 20),
                     "a first claim naming a live member's signing key", id="someone-elses-signing-key"),
        pytest.param(PLAIN, [(HELD, VICTIM)], put(PLAIN, 3, forged(PLAIN, member(3, 1, VICTIM), VICTIM), 20, 20),
                     "a copy of a live member's public key under its signing key", id="copy-of-live-key"),
        pytest.param(PLAIN, [(HELD, VICTIM)], put(PLAIN, 1, forged(PLAIN, member(1, 9, VICTIM, seq=6), VICTIM), 20, 5),
                     "a rewrite within the entry under the holder's key", id="rewrite-in-entry"),
        pytest.param(PLAIN, [(HELD, VICTIM)], put(PLAIN, 1, forged(PLAIN, member(1, 9, VICTIM, seq=99), VICTIM), 20, 20),
                     "a new entry whose seq is compared with the holder's", id="seq-compared"),
        pytest.param(PINNED, [], put(PINNED, 2, forged(PINNED, member(2, 9, VICTIM), VICTIM), 20, 20),
                     "a first claim at a pinned gateway rank", id="pinned-gateway"),
        pytest.param(RANK_CA, [], put(RANK_CA, 3, forged(RANK_CA, member(3, 9, VICTIM, cert=CERT3), VICTIM), 20, 20),
                     "a first claim in a rank CA mesh with the holder's cert", id="rank-ca-first-claim"),
        pytest.param(RELAYED, [], put(RELAYED, 3, moved(RELAYED, member(3, 9, VICTIM), VICTIM), 20, 20),
                     "a first claim read through relays, its endpoint changed", id="relayed-first-claim"),
    ],
)  # fmt: skip
def test_a_forged_record_that_would_decide_is_verified_and_refused(
    spec: MeshSpec,
    before: list[tuple[Member, Signer]],
    event: WatchEvent,
    why: str,
    verified: list[str],
) -> None:
    view = holding(spec, *before) if before else MemberView()
    held = dict(view.members)
    del verified[:]
    if event.key.endswith("/1"):  # the entry deleted first (its lease ended) but for a rewrite
        if event.create_revision != 5:
            view.apply(spec, delete(spec, 1, 19))
    view.apply(spec, event)
    assert verified, why
    rank = int(event.key.rsplit("/", 1)[1])
    if rank in held and event.create_revision == 5:
        assert view.members[rank] == held[rank]  # the holder keeps its entry
    else:
        assert rank not in view.members, why
    assert not view.unproven
    assert view.bindings.owner(key(9)) is None  # no key bound from a forged record


def test_a_first_claim_that_decides_nothing_is_taken_unverified(verified: list[str]) -> None:
    view = MemberView()
    signers = [Signer.generate() for _ in range(8)]
    events = [put(PLAIN, r, record(PLAIN, member(r, 10 + r, s), s), 20 + r, 20 + r)
              for r, s in enumerate(signers)]  # fmt: skip
    view.apply_batch(PLAIN, events)
    assert verified == [] and set(view.unproven) == set(range(8)) and view.deferred_total == 8
    assert len(view.bindings) == 0  # no key bound from an unverified record
    view.apply(PLAIN, delete(PLAIN, 4, 40))  # leaving: verified, so its key's grace binds it
    assert verified == [signers[4].public_key] and view.bindings.owner(key(14)) is not None
    view.replace(PLAIN, [], 41)  # a list defers nothing: what was unproven is verified
    assert len(verified) == 8 and not view.unproven


@pytest.mark.parametrize(
    ("second", "holder_after"),
    [
        pytest.param(lambda: put(PLAIN, 5, record(PLAIN, member(5, 3, VICTIM), VICTIM), 30, 30),
                     {5: VICTIM}, id="the-key-holder-claims-elsewhere"),
        pytest.param(lambda: put(PLAIN, 3, record(PLAIN, member(3, 4, THIEF), THIEF), 30, 21),
                     {3: THIEF}, id="rewritten-under-another-key"),
        pytest.param(lambda: delete(PLAIN, 3, 30), {}, id="its-entry-deleted"),
        pytest.param(lambda: put(PLAIN, 5, encode_member(replace(member(5, 9, THIEF), signing_key="", seq=0)), 30, 30),
                     {5: None}, id="an-unsigned-record-carries-its-key"),
        pytest.param(lambda: put(PLAIN, 3, record(PLAIN, member(3, 3, VICTIM), VICTIM), 30, 21),
                     {3: VICTIM}, id="the-named-key-rewrites-it"),  # the forgery's seq 99 ordered nothing
    ],
)  # fmt: skip
def test_an_unproven_forgery_is_verified_once_it_would_decide(
    second: object, holder_after: dict[int, Signer | None], verified: list[str]
) -> None:
    """A forged first claim naming a key nobody carries decides nothing and is taken;
    once it would decide (its key carried again, its entry rewritten, its key's grace),
    it is verified, dropped as a bad entry and binds nothing."""
    view = MemberView()
    view.apply(PLAIN, put(PLAIN, 3, forged(PLAIN, member(3, 9, VICTIM, seq=99), VICTIM), 20, 21))
    assert verified == [] and set(view.unproven) == {3}
    view.apply(PLAIN, second())  # type: ignore[operator]
    signers = {rank: s.public_key if s else "" for rank, s in holder_after.items()}
    assert {rank: m.signing_key for rank, m in view.members.items()} == signers and verified
    assert view.bindings.owner(key(9)) is None
    assert view.bad_total == 1


BATCHES = {
    "update-after-claim": [(1, "a", 5), (1, "a", 6)],
    "replay-in-the-batch": [(1, "a", 6), (1, "a", 5)],
    "equal-seq-replay": [(1, "a", 6), (1, "a", 6)],
    "delete-then-claim": [(1, "a", 5), (1, "del", 0), (1, "b", 1)],
    "claim-then-delete": [(1, "a", 5), (1, "del", 0)],
    "other-key-then-holder": [(1, "b", 9), (1, "a", 5), (2, "b", 2)],
    "same-key-new-entry": [(1, "a", 5), (1, "del", 0), (1, "a", 6), (2, "b", 1)],
    "replay-in-a-new-entry": [(1, "a", 6), (1, "del", 0), (1, "a", 5)],
}
SIGNERS = {"a": VICTIM, "b": THIEF}


def batch(steps: list[tuple[int, str, int]]) -> list[WatchEvent]:
    events, create = [], {}
    for mod, (rank, who, seq) in enumerate(steps, start=20):
        if who == "del":
            create.pop(rank, None)
            events.append(delete(PLAIN, rank, mod))
            continue
        create.setdefault(rank, mod)
        s = SIGNERS[who]
        value = record(PLAIN, member(rank, rank + 10 * seq, s, seq=seq), s)
        events.append(put(PLAIN, rank, value, mod, create[rank]))
    return events


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_a_batch_reduced_ends_as_the_batch_applied_one_by_one(name: str) -> None:
    events = batch(BATCHES[name])
    reduced, each = MemberView(), MemberView()
    reduced.apply_batch(PLAIN, events)
    for event in events:
        each.apply(PLAIN, event)
    assert reduced.members == each.members
    assert reduced.created == each.created


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("update-after-claim", [1]),  # only the last record is decoded
        ("replay-in-the-batch", [0, 1]),  # a newer seq of the same key before: all kept
        ("equal-seq-replay", [0, 1]),
        ("delete-then-claim", [0, 1, 2]),  # another key before: its order is kept
        ("claim-then-delete", [0, 1]),  # a delete last keeps the batch as written
        ("other-key-then-holder", [0, 1, 2]),  # another key's record: a refused rewrite
        ("same-key-new-entry", [2, 3]),  # the delete and the older seq: dropped
        ("replay-in-a-new-entry", [0, 1, 2]),
    ],
)
def test_last_per_key_keeps_the_last_record_and_what_the_order_rule_needs(
    name: str, kept: list[int]
) -> None:
    events = batch(BATCHES[name])
    assert last_per_key(events) == [events[i] for i in kept]


def test_a_replay_in_one_batch_is_still_refused() -> None:
    events = batch(BATCHES["replay-in-the-batch"])
    view = MemberView()
    view.apply_batch(PLAIN, events)
    assert view.members[1].seq == 6 and view.refused_total == 1


def test_an_unsigned_copy_of_an_unproven_members_key_is_a_copy(verified: list[str]) -> None:
    """The copy decides nothing by itself (no proof), but the member it copies is
    verified then, so its key is bound and the copy ranks after it."""
    view = MemberView()
    view.apply(PLAIN, put(PLAIN, 3, record(PLAIN, member(3, 3, VICTIM), VICTIM), 20, 20))
    assert set(view.unproven) == {3} and verified == []
    copy = encode_member(replace(member(5, 3, THIEF), signing_key="", seq=0))
    view.apply(PLAIN, put(PLAIN, 5, copy, 21, 21))
    assert verified == [VICTIM.public_key] and view.bindings.copies == {5: key(3)}
    assert view.created[5] > view.created[3] and not view.unproven
