"""Garbage under the mesh prefix (issue 4, scenario 7), on fakes.

Every bad entry is skipped with a one-line message naming the key and the
field, logged once and counted; nothing crashes, no real member's peer is
touched, and a peer's allowed IPs come only from its rank. The e2e twin is
``tests/e2e/test_faults_members.py::test_garbage_is_skipped_logged_once_and_touches_no_peer``.
"""

from __future__ import annotations

import base64
import json
import logging
from ipaddress import ip_interface

import pytest
import trio
import trio.testing
from shared import create_leased
from shared import key as public_key

from vnetd.control.membership import (
    BadEntry,
    check_endpoint,
    decode_member,
    encode_member,
    member_key,
)
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView, sync_members
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.model import Member
from vnetd.registry.base import KeyValue
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 10, "network": "10.250.0.0/16"}})
PREFIX = "/vnetd/m/members/"


def member(rank: int, key: int | None = None) -> Member:
    return Member(
        rank, public_key(rank if key is None else key), f"198.18.1.{rank}:51820", f"pod{rank}"
    )


def record(key_rank: int, **changes: object) -> bytes:
    """A record as rank ``key_rank``'s daemon writes it, with ``changes`` applied."""
    rank = key_rank
    fields = {
        "rank": rank,
        "public_key": public_key(rank),
        "endpoint": f"198.18.1.{rank}:51820",
        "instance": f"pod{rank}",
        "started": 1.0,
        "version": "0.1.0",
        **changes,
    }
    return json.dumps(fields).encode()


# (key suffix, value, what the message says). Each key is distinct, so the
# whole table can sit in one registry at once.
GARBAGE = [
    pytest.param("3", b'{"rank": 3,', "value is not JSON", id="invalid-json"),
    pytest.param("4", b"[" * 100_000, "value is not JSON", id="deeply-nested-json"),
    pytest.param(
        "5",
        record(5, public_key=base64.b64encode(b"k" * 16).decode()),
        "public_key is 16 bytes, not 32",
        id="public-key-of-wrong-length",
    ),
    pytest.param("99", record(99), r"rank 99 is out of range 0\.\.9", id="rank-outside-spec"),
    pytest.param("02", record(2), "not a rank key", id="leading-zero-key"),
    pytest.param("x", record(2), "not a rank key", id="non-numeric-key"),
    pytest.param("\u00b2", record(2), "not a rank key", id="superscript-digit-key"),
    pytest.param("\uff16", record(6), "not a rank key", id="fullwidth-digit-key"),
    pytest.param(
        "6", record(6, endpoint="pod6.lab:51820"), "is not an IP address", id="endpoint-hostname"
    ),
    pytest.param(
        "7", record(7, endpoint="[fe80::1%eth9]:51820"), "IPv6 zone", id="endpoint-with-zone"
    ),
    pytest.param(
        "1/endpoint", record(1), "not a rank key", id="key-below-a-rank-key"
    ),  # not rank 1
]

# Endpoints no peer can be reached at (checked by decode_member, one rank each time).
UNREACHABLE_ENDPOINTS = [
    pytest.param("7", record(7, endpoint="127.0.0.1:51820"), "loopback", id="endpoint-loopback"),
    pytest.param(
        "7", record(7, endpoint="169.254.169.254:80"), "link-local", id="endpoint-metadata-service"
    ),
    pytest.param("7", record(7, endpoint="[fe80::1]:51820"), "link-local", id="endpoint-fe80"),
    pytest.param("7", record(7, endpoint="224.0.0.1:51820"), "multicast", id="endpoint-multicast"),
    pytest.param("7", record(7, endpoint="[ff02::1]:51820"), "multicast", id="endpoint-ff02"),
    pytest.param("7", record(7, endpoint="0.0.0.0:51820"), "unspecified", id="endpoint-any"),
    pytest.param(
        "7", record(7, endpoint="[::ffff:127.0.0.1]:51820"), "loopback", id="endpoint-mapped-lo"
    ),
    pytest.param(
        "7", record(7, endpoint="255.255.255.255:51820"), "broadcast", id="endpoint-broadcast"
    ),
    pytest.param(
        "7",
        record(7, endpoint="10.250.0.3:51820"),
        "inside the overlay network",
        id="endpoint-inside-the-overlay",
    ),  # fmt: skip
    pytest.param(
        "7",
        record(7, public_endpoint="127.0.0.1:51820"),
        "field public_endpoint: .*loopback",
        id="public-endpoint-loopback",
    ),  # fmt: skip
]

# Entries that are rank keys of the spec: each needs its own free rank.
LIARS = [
    pytest.param(
        "3", record(3, rank=1), "field rank=1 does not match the key", id="claims-another-rank"
    ),
    pytest.param(
        "4",
        record(4, allowed_ips=["10.250.0.2/32", "10.250.0.0/16"]),
        "field allowed_ips is not accepted",
        id="claims-allowed-ips",
    ),
    pytest.param(
        "5", record(5, address="10.250.0.2"), "field address is not accepted", id="claims-address"
    ),
    pytest.param(
        "6", record(6, started=10**400), "started is not a finite number", id="huge-started"
    ),
    pytest.param(
        "7",
        record(7, instance="pod7\nrank 0 is held by pod7"),
        "instance has unprintable characters",
        id="instance-with-newline",
    ),
    pytest.param(
        "7", record(7, endpoint="198.18.1.7:\u00b2"), "HOST:PORT", id="port-superscript-digit"
    ),
]


@pytest.mark.parametrize(("suffix", "value", "message"), GARBAGE + LIARS + UNREACHABLE_ENDPOINTS)
def test_each_kind_of_garbage_is_a_bad_entry_naming_the_field(suffix, value, message):
    with pytest.raises(BadEntry, match=message) as raised:
        decode_member(SPEC, PREFIX + suffix, value)
    assert "\n" not in str(raised.value)


def test_unknown_fields_are_ignored_for_forward_compatibility():
    decoded = decode_member(SPEC, PREFIX + "3", record(3, features=["roaming"], zone="b"))
    assert decoded == Member(3, public_key(3), "198.18.1.3:51820", "pod3", 1.0, "0.1.0")


@pytest.mark.parametrize(
    "suffix",
    [pytest.param("x\ny" * 3, id="newline"), pytest.param("9" * 5000, id="long")],
)
def test_message_about_a_bad_key_is_one_short_line(suffix):
    with pytest.raises(BadEntry) as raised:
        decode_member(SPEC, PREFIX + suffix, b"{}")
    assert "\n" not in str(raised.value)
    assert len(str(raised.value)) < 200


def test_endpoint_with_a_zone_is_refused_also_as_a_flag():
    with pytest.raises(ValueError, match="IPv6 zone"):
        check_endpoint("[fe80::1%eth0]:51820")
    with pytest.raises(ValueError, match="link-local"):  # no zone: still no peer's underlay
        check_endpoint("[fe80::1]:51820")
    assert check_endpoint("[fd00::1]:51820") == "[fd00::1]:51820"


async def wait_for(condition, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


def skip_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipping bad registry entry" in r.message]


async def test_view_skips_logs_once_counts_and_accepts_a_fixed_entry(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="vnetd.watch")
    registry = MemoryRegistry()
    for rank in (0, 1, 2):
        await create_leased(registry, member_key(SPEC, rank), encode_member(member(rank)))
    real = {rank: member(rank) for rank in (0, 1, 2)}
    view = MemberView()
    health = RegistryHealth()
    async with trio.open_nursery() as nursery:
        await nursery.start(sync_members, registry, SPEC, view, health)
        await wait_for(lambda: view.members == real)
        for param in GARBAGE:
            suffix, value, _ = param.values
            await create_leased(registry, PREFIX + suffix, value)
        await wait_for(lambda: view.bad_total == len(GARBAGE))
        assert view.members == real, "garbage touched a real member"
        assert len(skip_lines(caplog)) == len(GARBAGE)

        # A fresh list (here: after an outage) sees the same garbage: no new lines.
        relisted = view.version
        registry.fail(True)
        await trio.sleep(10)
        registry.fail(False)
        await wait_for(lambda: view.version > relisted and health.reachable is True)
        assert view.bad_total == len(GARBAGE)
        assert len(skip_lines(caplog)) == len(GARBAGE)
        assert view.members == real

        # The invalid JSON under free rank 3 is fixed: rank 3 joins.
        bad = await registry.get(PREFIX + "3")
        assert bad is not None
        assert await registry.replace(PREFIX + "3", record(3), bad.mod_revision, bad.lease)
        await wait_for(lambda: 3 in view.members)
        assert view.members[3] == Member(3, public_key(3), "198.18.1.3:51820", "pod3", 1.0, "0.1.0")
        assert PREFIX + "3" not in view.bad_entries
        assert view.bad_total == len(GARBAGE)
        nursery.cancel_scope.cancel()


def device_config(rank: int) -> DeviceConfig:
    return DeviceConfig(
        interface="vnet0",
        private_key=base64.b64encode(bytes(32)).decode(),
        listen_port=51820,
        address=ip_interface(f"{SPEC.address(rank)}/16"),
        network=SPEC.network,
        mtu=1420,
    )


async def test_reconciler_touches_no_peer_and_takes_addresses_from_ranks(caplog):
    """Rank 0's device with real ranks 1 and 2, while the registry also holds all
    of GARBAGE, rank 1's key under free rank 8 and rank 0's own key under free rank 9."""
    caplog.set_level(logging.INFO, logger="vnetd.reconcile")
    members = [member(0), member(1), member(2), member(8, key=1), member(9, key=0)]
    entries = [kv(member_key(SPEC, m.rank), encode_member(m)) for m in members]
    entries += [kv(PREFIX + p.values[0], p.values[1]) for p in GARBAGE]
    view = MemberView()
    view.replace(SPEC, sorted(entries))
    assert view.bad_total == len(GARBAGE)
    dataplane = FakeDataplane(device_config(0))
    reconciler = Reconciler(SPEC, 0, public_key(0), view, dataplane)
    first = await reconciler.reconcile_once()
    assert sorted(p.rank for p in first.add) == [1, 2]
    for _ in range(3):
        assert not await reconciler.reconcile_once()
    assert len(dataplane.applied) == 1
    device = await dataplane.peers()
    assert {k: p.allowed_ips for k, p in device.items()} == {
        public_key(1): ("10.250.0.2/32",),
        public_key(2): ("10.250.0.3/32",),
    }
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.message]
    assert skipped == [
        "member rank 8 skipped: public key already registered by rank 1",
        "member rank 9 skipped: registers this rank's own public key",
    ]


def kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, create_revision=1, mod_revision=1, lease=1)
