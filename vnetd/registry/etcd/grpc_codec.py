"""The messages of etcd's ``Watch`` RPC, built with protobuf's descriptor API, and their
codec to and from vnetd's records (``WatchEvent``).

Built here, not generated: etcd publishes its ``.proto`` files with gogoproto options and
imports that protoc cannot resolve without etcd's source tree, generated ``_pb2`` modules
are tied to the protobuf release that generated them (python-etcd3's no longer import,
docs/architecture.md), and running ``grpcio-tools`` at start (as ``bench/`` does) costs
a protoc run per process. The member watch needs seven messages; their descriptors are a
few lines, built once into a private pool, and serialize with the protobuf library's own
encoder, so the wire format is protobuf's and not hand-packed.

Field numbers and types are etcd's, from the mirror's ``api/etcdserverpb/rpc.proto``
(``ResponseHeader``: 1-4; ``WatchRequest``: ``create_request`` 1, ``cancel_request`` 2,
``progress_request`` 3 in one oneof; ``WatchCreateRequest``: ``key`` 1, ``range_end`` 2,
``start_revision`` 3, ``progress_notify`` 4, ``prev_kv`` 6, ``watch_id`` 7, ``fragment``
8; ``WatchCancelRequest``: ``watch_id`` 1; ``WatchProgressRequest``: empty;
``WatchResponse``: ``header`` 1, ``watch_id`` 2, ``created`` 3, ``canceled`` 4,
``compact_revision`` 5, ``cancel_reason`` 6, ``fragment`` 7, ``events`` 11) and
``api/mvccpb/kv.proto`` (``KeyValue``: ``key`` 1, ``create_revision`` 2, ``mod_revision``
3, ``version`` 4, ``value`` 5, ``lease`` 6; ``Event``: ``type`` 1, ``kv`` 2, ``prev_kv``
3), the same at v3.4.23 and v3.5.1. Two simplifications that leave the wire the same:
``Event.type`` is declared ``int32`` (an enum is a varint on the wire; PUT 0, DELETE 1),
and ``WatchCreateRequest.filters`` (5) is left out (vnetd filters nothing; an unknown
field is kept, not refused, by the decoder).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from vnetd.registry.base import WatchEvent
from vnetd.registry.bounds import kept_key, kept_value
from vnetd.registry.etcd.transport import prefix_end

WATCH_METHOD = "/etcdserverpb.Watch/Watch"
"""etcd's bidirectional watch stream (the same path behind etcd's grpc-proxy)."""
DELETE = 1
"""``mvccpb.Event.EventType.DELETE``."""

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, str]]] = {
    # message: (field, number, type, message type of a message field)
    "ResponseHeader": [("cluster_id", 1, _F.TYPE_UINT64, ""), ("member_id", 2, _F.TYPE_UINT64, ""),
                       ("revision", 3, _F.TYPE_INT64, ""), ("raft_term", 4, _F.TYPE_UINT64, "")],
    "KeyValue": [("key", 1, _F.TYPE_BYTES, ""), ("create_revision", 2, _F.TYPE_INT64, ""),
                 ("mod_revision", 3, _F.TYPE_INT64, ""), ("version", 4, _F.TYPE_INT64, ""),
                 ("value", 5, _F.TYPE_BYTES, ""), ("lease", 6, _F.TYPE_INT64, "")],
    "Event": [("type", 1, _F.TYPE_INT32, ""), ("kv", 2, _F.TYPE_MESSAGE, "KeyValue"),
              ("prev_kv", 3, _F.TYPE_MESSAGE, "KeyValue")],
    "WatchCreateRequest": [("key", 1, _F.TYPE_BYTES, ""), ("range_end", 2, _F.TYPE_BYTES, ""),
                           ("start_revision", 3, _F.TYPE_INT64, ""),
                           ("progress_notify", 4, _F.TYPE_BOOL, ""),
                           ("prev_kv", 6, _F.TYPE_BOOL, ""), ("watch_id", 7, _F.TYPE_INT64, ""),
                           ("fragment", 8, _F.TYPE_BOOL, "")],
    "WatchCancelRequest": [("watch_id", 1, _F.TYPE_INT64, "")],
    "WatchProgressRequest": [],
    "WatchRequest": [("create_request", 1, _F.TYPE_MESSAGE, "WatchCreateRequest"),
                     ("cancel_request", 2, _F.TYPE_MESSAGE, "WatchCancelRequest"),
                     ("progress_request", 3, _F.TYPE_MESSAGE, "WatchProgressRequest")],
    "WatchResponse": [("header", 1, _F.TYPE_MESSAGE, "ResponseHeader"),
                      ("watch_id", 2, _F.TYPE_INT64, ""), ("created", 3, _F.TYPE_BOOL, ""),
                      ("canceled", 4, _F.TYPE_BOOL, ""),
                      ("compact_revision", 5, _F.TYPE_INT64, ""),
                      ("cancel_reason", 6, _F.TYPE_STRING, ""),
                      ("fragment", 7, _F.TYPE_BOOL, ""),
                      ("events", 11, _F.TYPE_MESSAGE, "Event")],
}  # fmt: skip
_PACKAGE = "vnetd.etcdwatch"
"""The pool's package: names are not on the wire, and a private one cannot clash with
another ``etcdserverpb`` a process may register in protobuf's default pool."""
_REPEATED = {("WatchResponse", "events")}
_ONEOF = "WatchRequest"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="vnetd_etcd_watch.proto", package=_PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        if name == _ONEOF:
            message.oneof_decl.add(name="request_union")
        for field_name, number, kind, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind)
            repeated = (name, field_name) in _REPEATED
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
            if name == _ONEOF:
                field.oneof_index = 0
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


MESSAGES = _classes()
"""Each message's class by etcd's name (``MESSAGES["WatchResponse"]``)."""


class WatchMessage(NamedTuple):
    """One ``WatchResponse``, as the watch stream needs it."""

    revision: int
    """The store's revision (its header's)."""
    created: bool
    canceled: bool
    cancel_reason: str
    compact_revision: int
    events: list[WatchEvent]
    """Its events, bounded as every read's are (``registry.bounds``)."""


def create_request(prefix: str, start_revision: int) -> bytes:
    """A ``WatchRequest`` that watches the keys under ``prefix`` from ``start_revision``,
    with etcd's progress notifications asked for (``watch``, "quiet check")."""
    create = MESSAGES["WatchCreateRequest"](
        key=prefix.encode("utf-8", "surrogateescape"),
        range_end=prefix_end(prefix),
        start_revision=start_revision,
        progress_notify=True,
    )
    request: bytes = MESSAGES["WatchRequest"](create_request=create).SerializeToString()
    return request


def progress_request() -> bytes:
    """A ``WatchRequest`` that asks for a progress notification now. Not sent by the
    daemon (etcd's grpc-proxy drops it: ``grpc_watch``); here for the codec's tests."""
    progress = MESSAGES["WatchProgressRequest"]()
    request: bytes = MESSAGES["WatchRequest"](progress_request=progress).SerializeToString()
    return request


def decode_response(data: bytes) -> WatchMessage:
    """A serialized ``WatchResponse`` as a ``WatchMessage`` (gRPC's deserializer, so it
    runs on the stream's thread, off the event loop)."""
    response = MESSAGES["WatchResponse"].FromString(data)
    events = [
        WatchEvent(
            kind="delete" if event.type == DELETE else "put",
            key=kept_key(event.kv.key.decode("utf-8", "surrogateescape")),
            value=kept_value(event.kv.value),
            mod_revision=event.kv.mod_revision,
            create_revision=event.kv.create_revision,
            lease=event.kv.lease,
        )
        for event in response.events
    ]
    return WatchMessage(
        revision=response.header.revision,
        created=response.created,
        canceled=response.canceled,
        cancel_reason=response.cancel_reason,
        compact_revision=response.compact_revision,
        events=events,
    )
