"""The gRPC watch's messages (``vnetd.registry.etcd.grpc_codec``), byte for byte against
what etcd sent: two ``WatchResponse`` messages captured from etcd 3.4.23 on loopback
(a watch on ``/vnetd/lab/members/`` from revision 1 after a put with a lease and a
delete), and the create request checked once against the message ``protoc`` generates
from ``bench/etcd_watch.proto``."""

from __future__ import annotations

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet

from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.grpc_codec import (
    MESSAGES,
    create_request,
    decode_response,
    progress_request,
)

CREATED = bytes.fromhex("0a1908f2a99ad7ec80b8e81310e8c0a6fc87eaf7c39701180320021801")
EVENTS = bytes.fromhex(
    "0a1908f2a99ad7ec80b8e81310e8c0a6fc87eaf7c39701180320025a3412320a142f766e6574642f6c6162"
    "2f6d656d626572732f331002180220012a0a7b2272616e6b223a337d3085ecbcf694c9a8b4205a1c0801"
    "12180a142f766e6574642f6c61622f6d656d626572732f331803"
)
LEASE = 2335294842530117125
KEY = "/vnetd/lab/members/3"


def test_the_confirmation_decodes() -> None:
    message = decode_response(CREATED)
    assert (message.created, message.canceled, message.compact_revision) == (True, False, 0)
    assert (message.revision, message.events) == (3, [])


def test_events_decode_as_the_json_watch_decodes_them() -> None:
    message = decode_response(EVENTS)
    assert not message.created
    assert message.events == [
        WatchEvent("put", KEY, b'{"rank":3}', mod_revision=2, create_revision=2, lease=LEASE),
        WatchEvent("delete", KEY, b"", mod_revision=3),
    ]


@pytest.mark.parametrize("captured", [pytest.param(CREATED, id="created"),
                                      pytest.param(EVENTS, id="events")])  # fmt: skip
def test_the_message_types_encode_etcds_bytes_again(captured: bytes) -> None:
    """Every field etcd sent is declared at its number and type: nothing is left as an
    unknown field, and encoding gives etcd's bytes back."""
    response = MESSAGES["WatchResponse"].FromString(captured)
    assert response.SerializeToString() == captured
    parts = [response, response.header]
    parts += [part for event in response.events for part in (event, event.kv)]
    assert [len(UnknownFieldSet(part)) for part in parts] == [0] * len(parts)


def test_the_create_request_is_etcds() -> None:
    """The bytes of the request protoc's generated ``etcdserverpb.WatchRequest`` gave for
    the same fields (``bench/etcd_watch.proto``, grpcio-tools 1.x)."""
    assert create_request("/vnetd/lab/members/", 7) == bytes.fromhex(
        "0a2e0a132f766e6574642f6c61622f6d656d626572732f12132f766e6574642f6c61622f6d656d6265"
        "72733018072001"
    )


def test_a_progress_request_is_field_3_empty() -> None:
    assert progress_request() == bytes.fromhex("1a00")
