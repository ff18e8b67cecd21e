from __future__ import annotations

import base64
import json

import pytest
from shared import SPEC

from vnetd.control.membership import (
    BadEntry,
    check_endpoint,
    decode_member,
    encode_member,
    member_key,
)
from vnetd.model import Member

KEY = base64.b64encode(b"k" * 32).decode()
GOOD = {
    "rank": 2,
    "public_key": KEY,
    "endpoint": "198.18.1.3:51820",
    "instance": "pod-2",
    "started": 1.5,
    "version": "0.1.0",
}


def test_round_trip():
    m = Member(2, KEY, "198.18.1.3:51820", "pod-2", 1.5, "0.1.0")
    assert decode_member(SPEC, member_key(SPEC, 2), encode_member(m)) == m
    assert member_key(SPEC, 2) == "/vnetd/m/members/2"


def bad(**changes):
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not _DROP}).encode()


_DROP = object()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        pytest.param("/vnetd/m/members/x", bad(), "not a rank key", id="non-numeric-key"),
        pytest.param("/vnetd/m/members/02", bad(), "not a rank key", id="leading-zero-key"),
        pytest.param("/vnetd/m/members/9", bad(rank=9), "out of range", id="rank-out-of-range"),
        pytest.param("/vnetd/m/members/2", b"{", "not JSON", id="not-json"),
        pytest.param("/vnetd/m/members/2", b"[1]", "not a JSON object", id="not-object"),
        pytest.param(
            "/vnetd/m/members/2", bad(rank=3), "field rank=3 does not match", id="rank-mismatch"
        ),
        pytest.param(
            "/vnetd/m/members/2", bad(public_key="zz"), "public_key is not base64", id="bad-key"
        ),
        pytest.param(
            "/vnetd/m/members/2",
            bad(public_key=base64.b64encode(b"x").decode()),
            "public_key is 1 bytes",
            id="short-key",
        ),
        pytest.param(
            "/vnetd/m/members/2", bad(public_key=_DROP), "public_key is missing", id="no-key"
        ),
        pytest.param(
            "/vnetd/m/members/2",
            bad(endpoint="host:1"),
            "endpoint: .*not an IP",
            id="endpoint-hostname",
        ),
        pytest.param(
            "/vnetd/m/members/2",
            bad(endpoint="1.2.3.4"),
            "endpoint: .*HOST:PORT",
            id="endpoint-no-port",
        ),
        pytest.param(
            "/vnetd/m/members/2", bad(instance=""), "instance is missing", id="empty-instance"
        ),
        pytest.param(
            "/vnetd/m/members/2", bad(started="now"), "started is not a number", id="bad-started"
        ),
    ],
)
def test_bad_entries_name_the_field(key, value, message):
    with pytest.raises(BadEntry, match=message):
        decode_member(SPEC, key, value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("198.18.1.1:51820", "198.18.1.1:51820", id="v4"),
        pytest.param("[fd00::0001]:51820", "[fd00::1]:51820", id="v6-canonical"),
    ],
)
def test_check_endpoint(value, expected):
    assert check_endpoint(value) == expected


@pytest.mark.parametrize("value", ["fd00::1:51820", "1.2.3.4:0", "1.2.3.4:x", ":80"])
def test_check_endpoint_refuses(value):
    with pytest.raises(ValueError, match="."):
        check_endpoint(value)
