"""A full registry (etcd's NOSPACE) is classified, not mistaken for a refusal or an outage.

The answers are the JSON gateway's own, as etcd 3.4.23 and 3.5.1 gave them in the lab
once a quota was reached: HTTP 429, code 8, "etcdserver: mvcc: database space exceeded",
for a put, a txn with a put and a lease grant alike.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import check_response
from vnetd.registry.etcd.transport import RESOURCE_EXHAUSTED, Refused, RegistryFull, no_space

NOSPACE_MESSAGE = "etcdserver: mvcc: database space exceeded"
NOSPACE_BODY = {"error": NOSPACE_MESSAGE, "message": NOSPACE_MESSAGE, "code": 8}
"""etcd 3.4.23's body; 3.5.1 sends the same fields in another order."""
A, B = "http://a:2379", "http://b:2379"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(429, NOSPACE_BODY, RegistryFull, id="nospace-3.4-and-3.5"),
        pytest.param(429, {"error": NOSPACE_MESSAGE}, RegistryFull, id="nospace-without-code"),
        pytest.param(
            200,
            {"error": {"grpc_code": 8, "message": NOSPACE_MESSAGE}},
            RegistryFull,
            id="nospace-on-a-stream",
        ),
        pytest.param(
            429,
            {"error": "etcdserver: too many requests", "code": 8},
            Refused,
            id="code-8-but-not-space",
        ),
        pytest.param(
            400,
            {"error": NOSPACE_MESSAGE, "code": 3},
            Refused,
            id="the-words-under-another-code",
        ),
        pytest.param(
            503, {"error": "etcdserver: no leader", "code": 14}, RegistryUnavailable, id="outage"
        ),
        pytest.param(
            403, {"error": "etcdserver: permission denied", "code": 7}, Refused, id="permission"
        ),
    ],
)
def test_a_refusal_is_classified_by_etcds_words_and_code(
    status: int, body: dict[str, Any], expected: type[Exception]
) -> None:
    response = httpx.Response(status, json=body)
    with pytest.raises(expected) as caught:
        check_response(response, "http://a:2379/v3/kv/put")
    assert type(caught.value) is expected  # RegistryFull is a RegistryUnavailable: exactly


def test_full_is_an_outage_the_daemon_retries_and_names() -> None:
    full = RegistryFull("etcd put: " + NOSPACE_MESSAGE)
    assert isinstance(full, RegistryUnavailable) and isinstance(full, RegistryError)
    assert full.kind == "full" and RegistryUnavailable("x").kind == "unreachable"
    assert no_space(NOSPACE_MESSAGE, RESOURCE_EXHAUSTED)
    assert not no_space("etcdserver: too many requests", RESOURCE_EXHAUSTED)


class FullMembers:
    """Two members of a cluster whose NOSPACE alarm is on: writes refused, the rest served."""

    def __init__(self) -> None:
        self.hosts: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        path = request.url.path
        if path in ("/v3/kv/put", "/v3/kv/txn", "/v3/lease/grant"):
            return httpx.Response(429, json=NOSPACE_BODY)
        if path == "/v3/lease/keepalive":
            return httpx.Response(200, json={"result": {"ID": "42", "TTL": "5"}})
        return httpx.Response(200, json={"header": {"revision": "7"}, "kvs": []})


def full_registry(members: FullMembers) -> EtcdRegistry:
    registry = EtcdRegistry([A, B])
    registry._client = httpx.AsyncClient(transport=httpx.MockTransport(members))
    return registry


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda r: r.grant(10), id="lease-grant"),
        pytest.param(lambda r: r.create("/m/members/1", b"{}", 42), id="claim-txn"),
        pytest.param(lambda r: r.replace("/m/members/1", b"{}", 7, 42), id="update-txn"),
    ],
)
async def test_a_refused_write_is_full_on_the_first_member_and_reads_still_pass(
    write: Any,  # noqa: ANN401 (a call on the registry)
) -> None:
    members = FullMembers()
    registry = full_registry(members)
    with pytest.raises(RegistryFull, match="database space exceeded"):
        await write(registry)
    assert members.hosts == ["a"]  # not failed over: every member says the same
    assert await registry.keepalive(42) == 5
    assert await registry.get("/m/spec") is None
    assert members.hosts[1:] == ["a", "a"]  # member a was not marked failed
