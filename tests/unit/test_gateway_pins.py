"""Gateway ranks pinned to a signing key (``[sites.<name>] gateway_keys``): the spec
field, the readers' refusal, the claim and the start-up check (docs/security.md,
"Gateway ranks"). The e2e twin is tests/e2e/test_pinned_gateway.py.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from shared import byte_key as key

from vnetd.cli import main
from vnetd.control.claim_attempt import Claimed, Held, try_claim
from vnetd.control.membership import (
    BadEntry,
    check_pinned_signer,
    decode_member,
    encode_member,
    member_key,
)
from vnetd.control.proof import Signer, load_or_create_signer
from vnetd.control.watcher import MemberView
from vnetd.errors import IdentityError, SpecError
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

GATEWAY_SIGNER = Signer.generate()
INTRUDER_SIGNER = Signer.generate()
MESH = {"name": "m", "size": 8, "network": "10.250.0.0/16"}
SITES = {"b": {"gateways": [4, 5], "gateway_keys": {"4": GATEWAY_SIGNER.public_key}}}
SPEC = parse_spec({"mesh": MESH, "sites": SITES})
UNPINNED = parse_spec({"mesh": MESH, "sites": {"b": {"gateways": [4, 5]}}})
KEY4 = member_key(SPEC, 4)


def signed(member: Member, signer: Signer, lease: int = 7) -> bytes:
    at = member_key(SPEC, member.rank)
    return encode_member(
        replace(member, signing_key=signer.public_key), signer, key=at, lease=lease
    )


GATEWAY = Member(4, key(4), "10.2.0.10:51820", "gw4", 1.0, "1", site="b",
                 public_endpoint="198.18.0.2:40004",
                 signing_key=GATEWAY_SIGNER.public_key)  # fmt: skip
FORGED = replace(GATEWAY, public_key=key(40), instance="intruder",
                 signing_key=INTRUDER_SIGNER.public_key)  # fmt: skip


# --- the spec field ---------------------------------------------------------------------------


def test_a_pin_is_read_and_stored_with_the_mesh() -> None:
    assert SPEC.gateway_keys == ((4, GATEWAY_SIGNER.public_key),)
    assert (SPEC.pinned_key(4), SPEC.pinned_key(5), SPEC.pinned_key(0)) == (
        GATEWAY_SIGNER.public_key, None, None
    )  # fmt: skip
    assert SPEC.mesh_table()["gateway_keys"] == {"4": GATEWAY_SIGNER.public_key}
    # Pins are part of the compared [mesh]: daemons that disagree on them refuse to start.
    assert SPEC.differing_keys(UNPINNED.canonical_json()) == ["gateway_keys"]


def test_a_spec_without_pins_is_stored_as_before() -> None:
    assert "gateway_keys" not in UNPINNED.mesh_table()
    assert UNPINNED.pinned_key(4) is None


def sites_with(pins: Any) -> dict[str, Any]:  # noqa: ANN401 (any TOML value)
    sites = copy.deepcopy(SITES)
    sites["b"]["gateway_keys"] = pins
    return {"mesh": MESH, "sites": sites}


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        pytest.param("x", r"^sites\.b\.gateway_keys: expected a table, got a string$",
                     id="not-a-table"),
        pytest.param({"6": GATEWAY_SIGNER.public_key},
                     r"^sites\.b\.gateway_keys\.6: rank 6 is not one of sites\.b\.gateways "
                     r"\[4, 5\]; pin only the site's own gateway ranks$", id="not-a-gateway"),
        pytest.param({"04": GATEWAY_SIGNER.public_key},
                     r"^sites\.b\.gateway_keys\.04: '04' is not a rank", id="not-canonical"),
        pytest.param({"four": GATEWAY_SIGNER.public_key},
                     r"^sites\.b\.gateway_keys\.four: 'four' is not a rank", id="not-a-number"),
        pytest.param({"9" * 5000: GATEWAY_SIGNER.public_key},
                     r"^sites\.b\.gateway_keys\.9{20}: '9{20}' is not a rank", id="5000-digits"),
        pytest.param({"4": "abc"},
                     r"^sites\.b\.gateway_keys\.4: 'abc' is not a signing public key: give the "
                     r"gateway's \(base64 of 32 bytes\), as `vnetd signing-key` prints it$",
                     id="not-base64-32"),
        pytest.param({"4": 4}, r"^sites\.b\.gateway_keys\.4: expected a string, got an integer$",
                     id="not-a-string"),
    ],
)  # fmt: skip
def test_a_bad_pin_names_the_field_and_the_fix(pins: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(sites_with(pins))


# --- readers ----------------------------------------------------------------------------------


def test_the_pinned_key_registers_its_gateway() -> None:
    assert decode_member(SPEC, KEY4, signed(GATEWAY, GATEWAY_SIGNER), 7) == GATEWAY


@pytest.mark.parametrize(
    ("value", "how"),
    [
        pytest.param(signed(FORGED, INTRUDER_SIGNER), "signed by", id="another-signing-key"),
        pytest.param(encode_member(replace(FORGED, signing_key="")), "unsigned", id="unsigned"),
    ],
)
def test_a_pinned_rank_refuses_a_record_not_signed_by_its_pin(value: bytes, how: str) -> None:
    with pytest.raises(BadEntry, match=rf"pinned to .*gateway_keys\.4\), and this entry is {how}"):
        decode_member(SPEC, KEY4, value, 7)
    # Without the pin the same record is a registration like any other (today's rule).
    assert decode_member(UNPINNED, KEY4, value, 7).instance == "intruder"


def test_a_forged_pinned_gateway_carries_no_traffic_and_is_counted(caplog) -> None:
    """The reader skips the forgery, logs and counts it, and routes site b through
    the next gateway (5), not the intruder."""
    other = replace(GATEWAY, rank=5, public_key=key(5), instance="gw5", signing_key="")
    member0 = Member(0, key(0), "198.18.0.1:51820", "pod0", 1.0, "1")
    view = MemberView()
    kvs = [
        KeyValue(member_key(SPEC, 0), encode_member(member0), 2, 2, 3),
        KeyValue(KEY4, signed(FORGED, INTRUDER_SIGNER), 3, 3, 7),
        KeyValue(member_key(SPEC, 5), encode_member(other), 4, 4, 9),
    ]
    with caplog.at_level(logging.WARNING):
        view.replace(SPEC, kvs, 4)
    assert sorted(view.members) == [0, 5]
    assert view.bad_total == 1 and KEY4 in view.bad_entries
    assert "rank 4 is a gateway whose signing key is pinned" in caplog.text
    peers, _ = desired_peers(view.members, 0, SPEC)
    assert {peer.public_key for peer in peers.values()} == {key(5)}
    # The real gateway's registration, when it comes, is taken.
    view.apply(SPEC, WatchEvent("put", KEY4, signed(GATEWAY, GATEWAY_SIGNER, 11), 6, 5, 11))
    assert view.members[4] == GATEWAY


def test_a_relist_still_refuses_a_forgery_it_skipped_before() -> None:
    view = MemberView()
    kvs = [KeyValue(KEY4, signed(FORGED, INTRUDER_SIGNER), 3, 3, 7)]
    view.replace(SPEC, kvs, 3)
    view.replace(SPEC, kvs, 3)
    assert view.members == {} and view.bad_total == 1


# --- the claim and the start ------------------------------------------------------------------


async def test_the_pinned_gateway_takes_its_rank_back_from_a_forgery() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        intruder_lease = await registry.grant(30)
        forged = await try_claim(registry, SPEC, FORGED, intruder_lease, INTRUDER_SIGNER)
        assert isinstance(forged, Claimed)  # etcd lets any writer of the key do this
        lease = await registry.grant(30)
        result = await try_claim(registry, SPEC, GATEWAY, lease, GATEWAY_SIGNER)
        assert isinstance(result, Claimed) and result.took_over
        assert result.replaced.startswith("an entry not signed by the rank's pinned key (")
        entry = await registry.get(KEY4)
        assert entry is not None and entry.lease == lease
        assert decode_member(SPEC, KEY4, entry.value, lease) == replace(GATEWAY, seq=result.seq)
        # Unpinned, the forgery would hold the rank: the claim waits.
        other = await registry.grant(30)
        await registry.delete(KEY4)
        await try_claim(registry, UNPINNED, FORGED, other, INTRUDER_SIGNER)
        assert isinstance(await try_claim(registry, UNPINNED, GATEWAY, lease, GATEWAY_SIGNER),
                          Held)  # fmt: skip


def test_a_daemon_with_another_key_refuses_to_claim_a_pinned_rank() -> None:
    check_pinned_signer(SPEC, 4, GATEWAY_SIGNER.public_key, "s/signing.key")
    check_pinned_signer(SPEC, 5, INTRUDER_SIGNER.public_key, "s/signing.key")
    check_pinned_signer(UNPINNED, 4, INTRUDER_SIGNER.public_key, "s/signing.key")
    with pytest.raises(IdentityError, match=r"^rank 4: sites\.b\.gateway_keys\.4 pins its "
                       r"signing key to .*, and this signing key \(s/signing\.key\) is .*; "
                       r"run the gateway with the pinned key \(the state dir that holds it, "
                       r"or --signing-key-file FILE\), or pin this one \(`vnetd signing-key "
                       r"--state-dir DIR` prints it\)$"):  # fmt: skip
        check_pinned_signer(SPEC, 4, INTRUDER_SIGNER.public_key, "s/signing.key")
    with pytest.raises(IdentityError, match=r"this claim would be unsigned \(no --state-dir\)"):
        check_pinned_signer(SPEC, 4, "", "no --state-dir")


def test_signing_key_prints_the_key_to_pin(tmp_path: Path, capsys) -> None:
    state = tmp_path / "state"
    assert main(["signing-key", "--state-dir", str(state)]) == 2
    assert "does not exist; start the daemon once" in capsys.readouterr().err
    assert main(["signing-key", "--state-dir", str(state), "--create"]) == 0
    printed = capsys.readouterr().out.strip()
    assert (state.stat().st_mode & 0o777, (state / "signing.key").stat().st_mode & 0o777) == (
        0o700, 0o600
    )  # fmt: skip
    assert printed == load_or_create_signer(state).public_key
    assert main(["signing-key", "--key-file", str(state / "signing.key")]) == 0
    assert capsys.readouterr().out.strip() == printed
    private = (state / "signing.key").read_text().strip()
    assert private not in printed
    # The printed key is what the spec takes.
    pinned = parse_spec(sites_with({"4": printed}))
    assert pinned.pinned_key(4) == printed
    assert json.loads(pinned.canonical_json())["gateway_keys"] == {"4": printed}
