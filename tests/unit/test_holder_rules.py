"""Within one credential a rank belongs to its holder: signed records, the readers'
rules and the claim's (docs/architecture.md, "Registry layout").

The e2e twin of these tests, against real etcd and wireguard-go, is
tests/e2e/test_rank_holder.py.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import replace

import pytest
import trio
import trio.testing
from shared import byte_key as key

from vnetd.control.claim import ClaimHolder
from vnetd.control.claim_attempt import Claimed, Held, try_claim
from vnetd.control.holders import KeyBindings, may_rewrite
from vnetd.control.membership import (
    BadEntry,
    decode_member,
    encode_member,
    member_key,
)
from vnetd.control.proof import Signer, signed_bytes, verify
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import COPY_ORDER, MemberView
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec(
    {"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}, "registry": {"lease_ttl": 6}}
)
KEY1 = member_key(SPEC, 1)
KEY2 = member_key(SPEC, 2)
HOLDER_SIGNER = Signer.generate()
OTHER_SIGNER = Signer.generate()


HOLDER = Member(1, key(1), "198.18.1.1:51820", "pod1", 100.0, "1.0",
                signing_key=HOLDER_SIGNER.public_key)  # fmt: skip
UNSIGNED = replace(HOLDER, signing_key="")


def signed(member: Member, signer: Signer, at: str = KEY1, lease: int = 7) -> bytes:
    return encode_member(
        replace(member, signing_key=signer.public_key), signer, key=at, lease=lease
    )


# --- the proof --------------------------------------------------------------------------------


def with_field(field: str, change: Callable[[str], str]) -> str:
    """HOLDER's signed record with ``field`` changed by ``change``."""
    record = json.loads(signed(HOLDER, HOLDER_SIGNER))
    return json.dumps({**record, field: change(record[field])})


def test_a_signed_record_decodes_with_its_signing_key() -> None:
    assert decode_member(SPEC, KEY1, signed(HOLDER, HOLDER_SIGNER), 7) == HOLDER


def test_an_unsigned_record_is_what_older_versions_wrote() -> None:
    record = json.loads(encode_member(UNSIGNED))
    assert "signing_key" not in record and "proof" not in record
    assert decode_member(SPEC, KEY1, encode_member(UNSIGNED), 7) == UNSIGNED


@pytest.mark.parametrize(
    ("value", "at", "lease"),
    [
        pytest.param(signed(HOLDER, HOLDER_SIGNER), KEY1, 8, id="another-lease"),
        pytest.param(signed(HOLDER, HOLDER_SIGNER), KEY1, 0, id="no-lease"),
        pytest.param(
            json.dumps({**json.loads(signed(HOLDER, HOLDER_SIGNER)), "endpoint": "198.18.9.9:1"}),
            KEY1, 7, id="endpoint-changed",
        ),
        pytest.param(
            json.dumps({**json.loads(signed(HOLDER, OTHER_SIGNER)),
                        "signing_key": HOLDER_SIGNER.public_key}),
            KEY1, 7, id="another-signer-named-as-holder",
        ),
        pytest.param(
            json.dumps({**json.loads(signed(HOLDER, HOLDER_SIGNER)), "proof": None}),
            KEY1, 7, id="proof-missing",
        ),
        pytest.param(with_field("proof", lambda p: p[:-8]), KEY1, 7, id="proof-cut-short"),
        pytest.param(with_field("proof", lambda p: p + "AAAA"), KEY1, 7, id="proof-too-long"),
        pytest.param(with_field("proof", lambda p: "*" + p[1:]), KEY1, 7, id="proof-not-base64"),
        pytest.param(with_field("signing_key", lambda k: k[:-4]), KEY1, 7, id="key-cut-short"),
        pytest.param(with_field("signing_key", lambda k: "A" * 43 + "="), KEY1, 7,
                     id="key-all-zero"),
    ],
)  # fmt: skip
def test_a_proof_that_does_not_verify_is_a_bad_entry(
    value: bytes | str, at: str, lease: int
) -> None:
    raw = value.encode() if isinstance(value, str) else value
    with pytest.raises(BadEntry, match=r"proof"):
        decode_member(SPEC, at, raw, lease)


def test_signed_for_another_rank_does_not_verify_here() -> None:
    copy = json.loads(signed(HOLDER, HOLDER_SIGNER))
    copy["rank"] = 2
    with pytest.raises(BadEntry, match="proof does not verify"):
        decode_member(SPEC, KEY2, json.dumps(copy).encode(), 7)


def test_a_proof_made_by_cryptography_verifies() -> None:
    """The signer (cryptography) and the readers (libsodium) are two implementations of
    one standard: a record signed by one verifies under the other, and a change of one
    byte does not."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    public = base64.b64encode(private.public_key().public_bytes_raw()).decode()
    body = b'{"rank":1}'
    proof = base64.b64encode(private.sign(signed_bytes(KEY1, 7, body))).decode()
    assert verify(public, proof, KEY1, 7, body)
    assert not verify(public, proof, KEY1, 7, b'{"rank":2}')


def test_a_signer_never_shows_its_private_key() -> None:
    private = base64.b64encode(HOLDER_SIGNER.private_bytes()).decode()
    assert private not in repr(HOLDER_SIGNER)


# --- readers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        pytest.param(HOLDER, replace(HOLDER, public_key=key(2)), True, id="rotation"),
        pytest.param(HOLDER, replace(HOLDER, endpoint="198.18.1.5:1"), True,
                     id="restart-under-a-new-lease"),
        pytest.param(HOLDER, replace(HOLDER, public_key=key(9), signing_key=""), False,
                     id="unsigned-with-the-holders-instance"),
        pytest.param(HOLDER, replace(HOLDER, signing_key=OTHER_SIGNER.public_key), False,
                     id="another-signer-with-the-holders-instance"),
        pytest.param(UNSIGNED, replace(UNSIGNED, public_key=key(2)), True,
                     id="legacy-same-instance"),
        pytest.param(UNSIGNED, replace(HOLDER, instance="pod9"), False,
                     id="legacy-another-instance"),
    ],
)  # fmt: skip
def test_may_rewrite(old: Member, new: Member, allowed: bool) -> None:
    assert may_rewrite(old, new) is allowed


def holding_view() -> MemberView:
    view = MemberView()
    view.replace(SPEC, [KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER), 5, 5, 7)], 5)
    assert view.members == {1: HOLDER}
    return view


def test_a_rewrite_with_the_holders_instance_but_not_its_key_is_refused(caplog) -> None:
    view = holding_view()
    forged = encode_member(replace(UNSIGNED, public_key=key(9), endpoint="198.18.9.9:51820"))
    for mod in (6, 7, 8):
        view.apply(SPEC, WatchEvent("put", KEY1, forged, mod, 5, 0))
    assert view.members == {1: HOLDER}
    assert view.refused_total == 1
    assert view.overwritten == {1: 8}
    assert "not signed by its key" in caplog.text


def test_the_holder_rotates_its_key_under_its_signature() -> None:
    view = holding_view()
    rotated = replace(HOLDER, public_key=key(2))
    view.apply(SPEC, WatchEvent("put", KEY1, signed(rotated, HOLDER_SIGNER, lease=9), 6, 5, 9))
    assert view.members == {1: rotated}
    assert view.leases == {1: 9}


def test_a_copy_of_a_signed_key_ranks_after_its_holder_also_after_a_delete() -> None:
    now = [0.0]
    view = MemberView()
    view.bindings = KeyBindings(clock=lambda: now[0])
    view.replace(SPEC, [KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER), 5, 5, 7)], 5)
    copy = encode_member(replace(UNSIGNED, rank=2, instance="intruder"))
    view.apply(SPEC, WatchEvent("put", KEY2, copy, 6, 6, 8))
    assert view.bindings.copies == {2: key(1)} and view.created[2] == 6 + COPY_ORDER
    assert view.refused_total == 1
    peers, skipped = desired_peers(view.members, 0, SPEC, created=view.created)
    assert peers[key(1)].rank == 1
    assert [s.reason for s in skipped] == ["public key already registered by rank 1"]
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 7))
    view.apply(SPEC, WatchEvent("put", KEY1, signed(HOLDER, HOLDER_SIGNER, lease=9), 9, 9, 9))
    peers, _ = desired_peers(view.members, 0, SPEC, created=view.created)
    assert peers[key(1)].rank == 1  # claimed again after the copy: still the key's holder


def test_a_binding_ends_two_ttls_after_its_last_carrier_left() -> None:
    now = [0.0]
    view = MemberView()
    view.bindings = KeyBindings(clock=lambda: now[0])
    view.replace(SPEC, [KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER), 5, 5, 7)], 5)
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 6))
    copy = encode_member(replace(UNSIGNED, rank=2, instance="intruder"))
    view.apply(SPEC, WatchEvent("put", KEY2, copy, 7, 7, 8))
    assert view.created[2] == 7 + COPY_ORDER  # within the grace: still a copy
    view.apply(SPEC, WatchEvent("delete", KEY2, b"", 8))
    now[0] = 2 * SPEC.registry.lease_ttl + 1
    view.apply(SPEC, WatchEvent("put", KEY2, copy, 9, 9, 8))
    assert view.created[2] == 9 and view.bindings.copies == {}


def test_a_fresh_reader_gives_a_key_to_its_signed_registration() -> None:
    """A reader that lists after the attack: the unsigned copy came first, the signed
    member re-registered later; the signed one holds the key."""
    view = MemberView()
    copy = encode_member(replace(UNSIGNED, rank=2, instance="intruder"))
    view.replace(
        SPEC,
        [
            KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER, lease=9), 9, 9, 9),
            KeyValue(KEY2, copy, 6, 6, 8),
        ],
        9,
    )
    peers, _ = desired_peers(view.members, 0, SPEC, created=view.created)
    assert peers[key(1)].rank == 1
    assert view.bindings.copies == {2: key(1)}


# --- the claim --------------------------------------------------------------------------------


async def test_a_second_daemon_with_the_same_instance_waits() -> None:
    registry = MemoryRegistry()
    first_lease, twin_lease = await registry.grant(6), await registry.grant(6)
    first = await try_claim(registry, SPEC, HOLDER, first_lease, HOLDER_SIGNER)
    assert first == Claimed(False) and isinstance(first, Claimed)
    twin = replace(HOLDER, public_key=key(3), signing_key=OTHER_SIGNER.public_key)
    result = await try_claim(registry, SPEC, twin, twin_lease, OTHER_SIGNER)
    assert isinstance(result, Held) and result.holder == replace(HOLDER, seq=first.seq)
    restarted = await registry.grant(6)  # the same daemon, restarted within its lease
    again = await try_claim(registry, SPEC, HOLDER, restarted, HOLDER_SIGNER)
    assert again == Claimed(took_over=True)


@pytest.mark.parametrize(
    ("record", "named"),
    [
        pytest.param(lambda: encode_member(replace(UNSIGNED, instance="intruder")),
                     "instance intruder, unsigned", id="unsigned"),
        pytest.param(lambda: signed(replace(HOLDER, instance="intruder"), OTHER_SIGNER, lease=0),
                     f"instance intruder, signing key {OTHER_SIGNER.public_key[:12]}",
                     id="signed-by-the-intruder"),
        pytest.param(lambda: b"{junk", "an unreadable record", id="junk"),
    ],
)  # fmt: skip
async def test_a_leaseless_entry_is_taken_over_and_named(
    record: Callable[[], bytes], named: str
) -> None:
    registry = MemoryRegistry()
    await registry.create(KEY1, record())
    lease = await registry.grant(6)
    result = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER)
    assert result == Claimed(took_over=True, replaced=f"a leaseless entry ({named}, no lease)")


async def test_our_entry_overwritten_is_written_back_only_when_ours() -> None:
    registry = MemoryRegistry()
    lease, intruder = await registry.grant(6), await registry.grant(6)
    await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER)
    entry = await registry.get(KEY1)
    assert entry is not None
    forged = encode_member(replace(UNSIGNED, public_key=key(9), instance="intruder"))
    assert await registry.replace(KEY1, forged, entry.mod_revision, intruder)
    assert isinstance(await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER), Held)
    result = await try_claim(registry, SPEC, HOLDER, lease, HOLDER_SIGNER, entry.create_revision)
    assert result == Claimed(
        took_over=True,
        replaced=f"our entry, overwritten by another writer (instance intruder, unsigned, "
        f"lease {intruder:x})",
    )


async def test_a_holder_displaced_while_its_lease_lives_says_so(autojump_clock, caplog) -> None:
    caplog.set_level(logging.INFO)
    registry = MemoryRegistry()
    view = MemberView()
    health = RegistryHealth()
    me = replace(HOLDER, signing_key="")
    claim = ClaimHolder(registry, SPEC, me, health, view, HOLDER_SIGNER)
    async with trio.open_nursery() as nursery:
        from vnetd.control.watcher import sync_members

        await nursery.start(sync_members, registry, SPEC, view, health)
        await nursery.start(claim.run)
        await claim.claimed.wait()
        await trio.sleep(1)
        assert claim.state == "claimed"
        intruder = await registry.grant(60)
        await registry.delete(KEY1)
        await registry.create(KEY1, encode_member(replace(UNSIGNED, instance="x")), intruder)
        await trio.sleep(SPEC.registry.lease_ttl)
        assert (claim.state, claim.holder, claim.displaced) == ("displaced", "x", 1)
        assert claim.claimed_at is None
        await registry.revoke(intruder)  # the intruder's entry goes: the holder claims again
        await trio.sleep(3)
        assert claim.state == "claimed" and claim.displaced == 1
        nursery.cancel_scope.cancel()
    assert "displaced" in caplog.text


def test_a_relist_verifies_no_record_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    from vnetd.control import membership

    calls: list[str] = []
    real = membership.verify

    def counting(*args: object) -> bool:
        calls.append("verify")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(membership, "verify", counting)
    kvs = [KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER), 5, 5, 7)]
    view = MemberView()
    view.replace(SPEC, kvs, 5)
    view.replace(SPEC, kvs, 6)
    assert len(calls) == 1 and view.members == {1: HOLDER}
    moved = [KeyValue(KEY1, signed(HOLDER, HOLDER_SIGNER, lease=8), 5, 9, 8)]
    view.replace(SPEC, moved, 9)  # another lease: verified again
    assert len(calls) == 2
