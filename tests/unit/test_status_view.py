"""``vnetd status``'s pure core: rows, summary line, text formats and the JSON document."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from shared import wide_key as key

from vnetd.model import DevicePeer, Member
from vnetd.spec import parse_spec
from vnetd.status.table import plain_console, print_plain, status_renderable
from vnetd.status.view import (
    DeviceColumns,
    as_json,
    format_age,
    format_bytes,
    format_since,
    handshake_line,
    held_notes,
    is_silent,
    rank_rows,
    summary_line,
)

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def spec_of(size: int):
    return parse_spec({"mesh": {"name": "unit", "size": size, "network": "10.250.0.0/16"}})


def member(rank: int, started: float = NOW - 60) -> Member:
    return Member(rank, key(rank), f"198.18.1.{rank}:51820", f"pod{rank}", started, "0.1.0")


def members_of(*ranks: int) -> dict[int, Member]:
    return {rank: member(rank) for rank in ranks}


# --- rows -------------------------------------------------------------------------------


def test_every_rank_has_a_row_registered_or_not():
    rows = rank_rows(spec_of(5), members_of(0, 3), None, NOW)
    assert [(r.rank, r.address, r.hostname, r.registered) for r in rows] == [
        (0, "10.250.0.1", "unit-0", True),
        (1, "10.250.0.2", "unit-1", False),
        (2, "10.250.0.3", "unit-2", False),
        (3, "10.250.0.4", "unit-3", True),
        (4, "10.250.0.5", "unit-4", False),
    ]
    assert rows[0].member == member(0)
    assert rows[0].since_age == 60
    assert rows[1].member is None and rows[1].since_age is None
    assert all(row.device is None for row in rows), "no device read: no device columns"


def test_a_member_without_a_start_time_has_no_age():
    rows = rank_rows(spec_of(2), {0: member(0, started=0.0)}, None, NOW)
    assert rows[0].since_age is None


def test_device_columns_are_matched_by_the_registered_key():
    device = {
        key(1): DevicePeer(key(1), ("10.250.0.2/32",), "198.18.9.9:4000", NOW - 12, 100, 200),
        key(2): DevicePeer(key(2), ("10.250.0.3/32",)),
        key(9): DevicePeer(key(9), ("10.250.0.99/32",), None, NOW - 1, 5, 5),  # no member
    }
    rows = rank_rows(spec_of(5), members_of(0, 1, 2, 3), device, NOW, local_key=key(0))
    assert [row.device for row in rows] == [
        DeviceColumns("self"),
        DeviceColumns("peer", "198.18.9.9:4000", NOW - 12, 12.0, 100, 200),
        DeviceColumns("peer", None, 0.0, None, 0, 0),
        DeviceColumns("absent"),
        None,  # rank 4 is missing
    ]


def test_a_member_with_another_key_than_the_device_peer_is_absent():
    """A rank re-registered with a new key is not the device's old peer of that address."""
    device = {key(7): DevicePeer(key(7), ("10.250.0.2/32",), None, NOW - 1, 1, 1)}
    rows = rank_rows(spec_of(2), members_of(1), device, NOW)
    assert rows[1].device == DeviceColumns("absent")


def test_members_outside_the_spec_are_ignored():
    rows = rank_rows(spec_of(2), members_of(0, 1, 5), None, NOW)
    assert [row.rank for row in rows] == [0, 1]


# --- the summary line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "registered", "line"),
    [
        pytest.param(4, range(4), "4/4 registered", id="complete"),
        pytest.param(4, [], "0/4 registered, 4 missing: 0-3", id="none"),
        pytest.param(
            64,
            [r for r in range(64) if r not in (12, 40, 41)],
            "61/64 registered, 3 missing: 12, 40, 41",
            id="issue-example",
        ),
        pytest.param(
            1000,
            range(100, 1000),
            "900/1000 registered, 100 missing: 0-99",
            id="one-range",
        ),
        pytest.param(
            1000,
            [r for r in range(1000) if r % 10 != 3],
            "900/1000 registered, 100 missing: 3, 13, 23, 33, 43, 53, 63, 73, ... (100 in all)",
            id="many-groups-capped",
        ),
    ],
)
def test_summary_line(size, registered, line):
    rows = rank_rows(spec_of(size), members_of(*registered), None, NOW)
    assert summary_line(rows) == line


def test_handshake_line():
    device = {
        key(1): DevicePeer(key(1), (), None, NOW - 3),
        key(2): DevicePeer(key(2), ()),
    }
    rows = rank_rows(spec_of(6), members_of(0, 1, 2, 3, 4), device, NOW, local_key=key(0))
    assert handshake_line(rows) == (
        "device: 1/4 registered peers shook hands, never: 2; not on the device: 3, 4"
    )
    assert handshake_line(rank_rows(spec_of(6), members_of(0, 1), None, NOW)) is None


@pytest.mark.parametrize(
    ("peer", "silent"),
    [
        pytest.param(DevicePeer(key(1), (), None, 0.0, 0, 148), True, id="sent-never-shook-hands"),
        pytest.param(
            DevicePeer(key(1), (), None, NOW - 180, 92, 1480), True, id="sent-session-lifetime-ago"
        ),  # fmt: skip
        pytest.param(
            DevicePeer(key(1), (), None, NOW - 179, 92, 1480),
            False,
            id="shook-hands-within-the-session-lifetime",
        ),  # fmt: skip
        pytest.param(DevicePeer(key(1), (), None, 0.0, 0, 0), False, id="nothing-sent"),
    ],
)
def test_a_registered_peer_sent_to_without_a_recent_handshake_is_silent(peer, silent):
    rows = rank_rows(spec_of(3), members_of(0, 1), {key(1): peer}, NOW, local_key=key(0))
    assert is_silent(rows[1]) is silent
    notes = held_notes(rows, NOW)
    assert bool(notes) is silent
    if silent:
        assert notes[0].startswith("silent: rank 1 (instance 'pod1', since 22:12:20 (1 min 0 s))")
        assert "held_silent" in notes[0] and "partition" in notes[0]
        table = io.StringIO()
        print_plain(plain_console(table), status_renderable(spec_of(3), rows, NOW, plain=True))
        assert "(silent)" in table.getvalue() and "silent: rank 1" in table.getvalue()
        assert notes[0] in as_json(spec_of(3), members_of(0, 1), {key(1): peer}, NOW,
                                   local_key=key(0))["notes"]  # fmt: skip


def test_a_device_registered_at_no_rank_is_noted():
    device = {key(1): DevicePeer(key(1), (), None, NOW - 3, 92, 148)}
    rows = rank_rows(spec_of(3), members_of(0, 1), device, NOW, local_key=key(9))
    assert held_notes(rows, NOW) == [
        "this device is registered at no rank: its daemon has not claimed one (a claim that "
        "waits names the rank's holder in its log and in /status self.held_by)"
    ]
    assert held_notes(rank_rows(spec_of(3), members_of(0, 1), None, NOW), NOW) == []
    ours = rank_rows(spec_of(3), members_of(0, 1), device, NOW, local_key=key(0))
    assert held_notes(ours, NOW) == []


# --- text formats ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (12.9, "12 s"),
        (59, "59 s"),
        (60, "1 min 0 s"),
        (252, "4 min 12 s"),
        (3 * 3600 + 5 * 60 + 7, "3 h 5 min"),
        (2 * 86400 + 3 * 3600 + 1, "2 d 3 h"),
        (-5, "0 s"),  # the other host's clock is ahead
    ],
)
def test_format_age(seconds, text):
    assert format_age(seconds) == text


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1260, "1.23 KiB"),
        (47_815_065, "45.6 MiB"),
        (300 * 1024**2, "300 MiB"),
        (5 * 1024**3, "5.00 GiB"),
        (3000 * 1024**4, "3000 TiB"),
    ],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


def test_format_since_shows_the_date_only_when_not_today():
    assert format_since(NOW - 252, NOW) == "22:09:08 (4 min 12 s)"
    assert format_since(NOW - 2 * 86400, NOW) == "2023-11-12 22:13 (2 d 0 h)"


# --- the JSON document ----------------------------------------------------------------------


def test_json_document():
    device = {key(1): DevicePeer(key(1), ("10.250.0.2/32",), "198.18.1.1:51820", NOW - 5, 7, 8)}
    doc = as_json(
        spec_of(3),
        members_of(0, 1),
        device,
        NOW,
        local_key=key(0),
        bad_entries=1,
        notes=["a note"],
    )
    assert json.loads(json.dumps(doc)) == doc, "JSON-ready as it is"
    rows = doc.pop("ranks")
    assert doc == {
        "schema": 1,
        "mesh": "unit",
        "size": 3,
        "network": "10.250.0.0/16",
        "network6": None,
        "interface": "vnet0",
        "time": NOW,
        "time_utc": "2023-11-14T22:13:20Z",
        "registered": 2,
        "missing": [2],
        "summary": "2/3 registered, 1 missing: 2",
        "bad_entries": 1,
        "device": {"public_key": key(0), "peers": 1},
        "notes": ["a note"],
    }
    assert rows == [
        {
            "rank": 0,
            "address": "10.250.0.1",
            "addresses": ["10.250.0.1"],
            "hostname": "unit-0",
            "state": "registered",
            "instance": "pod0",
            "endpoint": "198.18.1.0:51820",
            "public_key": key(0),
            "version": "0.1.0",
            "started": NOW - 60,
            "started_utc": "2023-11-14T22:12:20Z",
            "device": {
                "role": "self",
                "endpoint": None,
                "last_handshake": None,
                "last_handshake_age": None,
                "rx_bytes": 0,
                "tx_bytes": 0,
            },
        },
        {
            "rank": 1,
            "address": "10.250.0.2",
            "addresses": ["10.250.0.2"],
            "hostname": "unit-1",
            "state": "registered",
            "instance": "pod1",
            "endpoint": "198.18.1.1:51820",
            "public_key": key(1),
            "version": "0.1.0",
            "started": NOW - 60,
            "started_utc": "2023-11-14T22:12:20Z",
            "device": {
                "role": "peer",
                "endpoint": "198.18.1.1:51820",
                "last_handshake": NOW - 5,
                "last_handshake_age": 5.0,
                "rx_bytes": 7,
                "tx_bytes": 8,
            },
        },
        {
            "rank": 2,
            "address": "10.250.0.3",
            "addresses": ["10.250.0.3"],
            "hostname": "unit-2",
            "state": "missing",
            "instance": None,
            "endpoint": None,
            "public_key": None,
            "version": None,
            "started": None,
            "started_utc": None,
            "device": None,
        },
    ]


def dual_stack_spec(size: int):
    return parse_spec(
        {
            "mesh": {
                "name": "unit",
                "size": size,
                "network": "10.250.0.0/16",
                "network6": "fd00:250::/64",
            }
        }
    )


def test_json_of_a_dual_stack_mesh_lists_both_addresses_primary_first():
    doc = as_json(dual_stack_spec(2), members_of(0), None, NOW)
    assert (doc["network"], doc["network6"]) == ("10.250.0.0/16", "fd00:250::/64")
    assert [(row["address"], row["addresses"]) for row in doc["ranks"]] == [
        ("10.250.0.1", ["10.250.0.1", "fd00:250::1"]),
        ("10.250.0.2", ["10.250.0.2", "fd00:250::2"]),
    ]


def test_table_of_a_dual_stack_mesh_has_an_address6_column_and_both_networks():
    spec = dual_stack_spec(2)
    rows = rank_rows(spec, members_of(0), None, NOW)
    out = io.StringIO()
    print_plain(plain_console(out), status_renderable(spec, rows, NOW, plain=True))
    lines = [line.split() for line in out.getvalue().splitlines() if line.strip()]
    assert lines[0] == ["mesh", "unit:", "2", "ranks", "in", "10.250.0.0/16", "and",
                        "fd00:250::/64,", "at", "2023-11-14T22:13:20Z"]  # fmt: skip
    assert lines[1][:4] == ["rank", "address", "address6", "hostname"]
    assert lines[2][:5] == ["0", "10.250.0.1", "fd00:250::1", "unit-0", "registered"]
    assert lines[3][:5] == ["1", "10.250.0.2", "fd00:250::2", "unit-1", "missing"]


def test_table_of_a_single_stack_mesh_has_no_address6_column():
    spec = spec_of(1)
    out = io.StringIO()
    rows = rank_rows(spec, members_of(0), None, NOW)
    print_plain(plain_console(out), status_renderable(spec, rows, NOW, plain=True))
    header = [line for line in out.getvalue().splitlines() if line.strip()][1]
    assert header.split()[:3] == ["rank", "address", "hostname"]


def test_json_without_a_device_has_the_same_keys():
    with_device = as_json(spec_of(2), members_of(0), {}, NOW)
    without = as_json(spec_of(2), members_of(0), None, NOW)
    assert without["device"] is None and with_device["device"] == {"public_key": None, "peers": 0}
    assert [set(row) for row in without["ranks"]] == [set(row) for row in with_device["ranks"]]
    assert without["ranks"][0]["device"] is None
    assert with_device["ranks"][0]["device"]["role"] == "absent"


def test_the_view_is_pure():
    """The view backs the daemon's /status too: it must not pull in trio, httpx or pyroute2."""
    code = "import sys, vnetd.status.view; print(sorted({'trio', 'httpx', 'pyroute2'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, "[]\n"), result.stderr
