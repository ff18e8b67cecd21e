"""Trust boundaries enforced by the reader (MemberView, then desired_peers).

Someone with write access to the registry can rewrite a member's entry, but
readers accept from such a rewrite only what the member itself could have
written: a different instance (or junk) in an entry never deleted is
refused, the allowed IPs always come from the rank, and only the endpoint
of a member moves the device.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
from shared import SPEC
from shared import byte_key as key

from vnetd.control.membership import encode_member, member_key
from vnetd.control.watcher import MemberView
from vnetd.mesh.peers import desired_peers
from vnetd.model import Member
from vnetd.registry.base import KeyValue, WatchEvent

KEY1 = member_key(SPEC, 1)


HOLDER = Member(1, key(1), "198.18.1.1:51820", "pod1", started=100.0, version="1.0")
INTRUDER = Member(1, key(9), "198.18.9.9:51820", "intruder", started=200.0, version="6.6")


def put(member: Member | bytes, create: int, mod: int) -> WatchEvent:
    value = member if isinstance(member, bytes) else encode_member(member)
    return WatchEvent("put", KEY1, value, mod, create, 1)


def view_holding() -> MemberView:
    view = MemberView()
    view.replace(SPEC, [KeyValue(KEY1, encode_member(HOLDER), 5, 5, 1)], 5)
    return view


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(INTRUDER, id="other-instance-and-key"),
        pytest.param(replace(INTRUDER, public_key=HOLDER.public_key), id="other-instance"),
        pytest.param(b"{not json", id="junk"),
    ],
)
def test_a_rewrite_of_a_held_entry_by_another_instance_is_refused(value, caplog) -> None:
    view = view_holding()
    before = view.version
    view.apply(SPEC, put(value, create=5, mod=6))
    view.apply(SPEC, put(value, create=5, mod=7))
    assert view.members == {1: HOLDER}
    assert view.version == before  # nothing for the reconciler to do
    assert view.refused_total == 1
    refusals = [r for r in caplog.records if "refusing a rewrite of rank 1" in r.getMessage()]
    assert len(refusals) == 1  # logged once per entry


def test_the_same_instance_may_rewrite_its_entry() -> None:
    view = view_holding()
    rotated = replace(HOLDER, public_key=key(2), endpoint="198.18.1.2:51820")
    view.apply(SPEC, put(rotated, create=5, mod=6))
    assert view.members == {1: rotated}
    assert view.refused_total == 0


def test_an_entry_deleted_and_created_again_is_a_new_claim() -> None:
    view = view_holding()
    view.apply(SPEC, WatchEvent("delete", KEY1, b"", 6))
    view.apply(SPEC, put(INTRUDER, create=7, mod=7))
    assert view.members == {1: INTRUDER}
    assert view.refused_total == 0


def test_a_relist_refuses_an_overwrite_but_takes_a_missed_delete_and_create() -> None:
    view = view_holding()
    view.replace(SPEC, [KeyValue(KEY1, encode_member(INTRUDER), 5, 8, 1)], 8)
    assert view.members == {1: HOLDER}
    assert view.refused_total == 1
    view.replace(SPEC, [KeyValue(KEY1, encode_member(INTRUDER), 9, 9, 1)], 9)
    assert view.members == {1: INTRUDER}


def test_a_registry_entry_cannot_give_a_peer_another_address() -> None:
    """Extra fields naming addresses are ignored or refused; the rank decides."""
    record = json.loads(encode_member(HOLDER))
    view = MemberView()
    for extra in ({"allowed_ips": ["0.0.0.0/0"]}, {"address": "10.250.0.3"}, {}):
        view.replace(SPEC, [KeyValue(KEY1, json.dumps({**record, **extra}).encode(), 5, 5, 1)], 5)
        peers, _ = desired_peers(view.members, 0, SPEC)
        # A record naming an address is skipped (decode_member); else the rank decides.
        assert [p.allowed_ips for p in peers.values()] == ([] if extra else [("10.250.0.2/32",)])


def test_only_the_endpoint_of_a_member_reaches_the_device() -> None:
    """Instance, version, started and unknown fields change nothing a peer is made of."""
    view = view_holding()
    before, _ = desired_peers(view.members, 0, SPEC)
    record = json.loads(encode_member(HOLDER))
    changed = {**record, "version": "9.9", "started": 1.0, "colour": "red"}
    view.apply(SPEC, put(json.dumps(changed).encode(), create=5, mod=6))
    assert desired_peers(view.members, 0, SPEC)[0] == before
    moved = {**changed, "endpoint": "198.18.7.7:51820"}
    view.apply(SPEC, put(json.dumps(moved).encode(), create=5, mod=7))
    (old,) = before.values()
    (peer,) = desired_peers(view.members, 0, SPEC)[0].values()
    assert peer == replace(old, endpoint="198.18.7.7:51820")


def test_logging_the_refusal_does_not_show_the_record(caplog) -> None:
    caplog.set_level(logging.WARNING)
    view = view_holding()
    view.apply(SPEC, put(INTRUDER, create=5, mod=6))
    assert INTRUDER.public_key not in caplog.text
