"""A full registry (etcd's NOSPACE) is classified, not mistaken for a refusal or an outage.

The answers are the JSON gateway's own, as etcd 3.4.23 and 3.5.1 gave them in the lab
once a quota was reached: HTTP 429, code 8, "etcdserver: mvcc: database space exceeded",
for a put, a txn with a put and a lease grant alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_daemon import Cluster
from test_status_command import Screen, register, status, wall_clock

from vnetd.commands.status.plan import StatusPlan
from vnetd.control.membership import member_key
from vnetd.control.write_probe import PROBE_TIMEOUT, writes_refused
from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.observe.endpoints import DaemonEndpoints
from vnetd.observe.metrics import DaemonMetrics
from vnetd.registry.base import KeyValue
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.gateway import check_response
from vnetd.registry.etcd.transport import RESOURCE_EXHAUSTED, Refused, RegistryFull, no_space
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import load_spec

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


class FullMemoryRegistry(MemoryRegistry):
    """The fake registry with etcd's NOSPACE behaviour while ``full``: puts, txns with a
    put and lease grants refused; reads, deletes and keepalives served."""

    full = False

    def _refuse_if_full(self) -> None:
        if self.full:
            raise RegistryFull(f"etcd put: {NOSPACE_MESSAGE} (HTTP 429, code 8)")

    async def create(self, key: str, value: bytes, lease: int = 0) -> KeyValue | None:
        self._refuse_if_full()
        return await super().create(key, value, lease)

    async def create_all(self, items: Mapping[str, bytes]) -> bool:
        self._refuse_if_full()
        return await super().create_all(items)

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        self._refuse_if_full()
        return await super().replace(key, value, mod_revision, lease)

    async def grant(self, ttl: int) -> int:
        self._refuse_if_full()
        return await super().grant(ttl)


async def stored(registry: MemoryRegistry, key: str) -> bytes:
    kv = await registry.get(key)
    return kv.value if kv is not None else b""


def full_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("registry full")]


async def test_a_rank_that_cannot_claim_names_the_full_registry_and_the_mesh_stays(
    tmp_path: Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        registry = cluster.registry = FullMemoryRegistry()
        for rank in (0, 1):
            await cluster.start(rank)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        peers = {name: dict(device.device) for name, device in cluster.devices.items()}

        registry.full = True
        late = await cluster.start(2)
        await trio.sleep(60)  # ten lease TTLs, many claim retries
        assert late.claim.state == "claiming" and late.health.full is not None
        assert late.health.full_refusals > 5
        assert len(full_lines(caplog)) == 1  # named once, not at every retry
        assert await registry.get(member_key(late.spec, 2)) is None
        for rank in (0, 1):  # keepalives pass while full: the mesh keeps its members
            assert await registry.get(member_key(late.spec, rank)) is not None
        assert {n: dict(cluster.devices[n].device) for n in peers} == peers  # invariant 5
        assert cluster.peer_ranks("pod2") == {0, 1}  # peers before the claim, as ever

        endpoints = DaemonEndpoints(late.spec, late.me, DaemonMetrics())
        endpoints.attach(late)
        ready = await endpoints.ready()
        assert not ready.ok and "rank 2 is not claimed: registry full" in ready.detail
        assert "database space exceeded" in ready.detail and "alarm" in ready.detail
        status = await endpoints.status()
        assert status["self"]["registry_full"] == late.health.full
        assert any(
            note.startswith("registry full: etcd refuses writes") for note in status["notes"]
        )
        metrics = (await endpoints.metrics()).decode()
        assert "vnetd_registry_full 1.0" in metrics

        registry.full = False
        with trio.fail_after(10):
            await late.claim.claimed.wait()
        await cluster.wait_full(["pod0", "pod1", "pod2"], {0, 1, 2})
        assert late.health.full is None
        assert "vnetd_registry_full 0.0" in (await endpoints.metrics()).decode()
        assert any("registry takes writes again" in r.getMessage() for r in caplog.records)
        nursery.cancel_scope.cancel()


async def test_a_record_update_refused_for_space_waits_and_keeps_the_claim(
    tmp_path: Path, autojump_clock: object
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        registry = cluster.registry = FullMemoryRegistry()
        held = await cluster.start(0)
        await cluster.start(1)
        await cluster.wait_full(["pod0", "pod1"], {0, 1})
        registry.full = True
        held.claim.set_device_id("feedfacefeedface")  # a new wireguard-go: a record update
        await trio.sleep(30)
        assert held.claim.state == "claimed" and held.health.full is not None
        kv = await registry.get(member_key(held.spec, 0))
        assert kv is not None and b"feedfacefeedface" not in kv.value
        registry.full = False
        with trio.fail_after(10):  # written at the next renewal
            while b"feedfacefeedface" not in await stored(registry, member_key(held.spec, 0)):
                await trio.sleep(0.1)
        assert held.claim.claims == 1 and held.health.full is None
        nursery.cancel_scope.cancel()


class CountingFullRegistry(FullMemoryRegistry):
    grants = 0

    async def grant(self, ttl: int) -> int:
        self.grants += 1
        return await super().grant(ttl)


@pytest.mark.parametrize(
    ("registered", "is_full", "note", "grants"),
    [
        pytest.param((0, 2), True, True, 1, id="ranks-missing-and-full-names-it"),
        pytest.param((0, 2), False, False, 1, id="ranks-missing-writes-pass-no-note"),
        pytest.param((0, 1, 2, 3), True, False, 0, id="all-registered-asks-nothing"),
    ],
)
async def test_status_names_a_full_registry_when_ranks_are_missing(
    config: Path, registered: tuple[int, ...], is_full: bool, note: bool, grants: int
) -> None:
    plan = StatusPlan(load_spec(config), json=True)
    registry = CountingFullRegistry()
    for rank in registered:
        await register(registry, plan.spec, rank)  # each under a lease of its own
    registry.grants = 0  # only what status asks for counts
    members_leases = set(registry._leases)
    registry.full = is_full
    screen = Screen()
    assert await status(plan, registry, screen) == 0
    notes = json.loads(screen.text)["notes"]
    full_notes = [n for n in notes if n.startswith("registry full: etcd refuses writes")]
    assert len(full_notes) == int(note), notes
    if note:
        assert "database space exceeded" in full_notes[0] and "alarm" in full_notes[0]
    assert registry.grants == grants
    assert set(registry._leases) == members_leases  # the probe's, if any, revoked at once


async def test_status_watch_asks_at_most_every_full_check(
    config: Path, autojump_clock: object
) -> None:
    plan = StatusPlan(load_spec(config), json=True, watch=True, interval=2.0)
    registry = CountingFullRegistry()
    registry.full = True
    screen = Screen()
    await status(plan, registry, screen, iterations=25, clock=wall_clock)  # 48 s of views
    views = [json.loads(line) for line in screen.text.splitlines()]
    assert len(views) == 25
    assert all(any(n.startswith("registry full") for n in v["notes"]) for v in views)
    assert registry.grants == 2  # at 0 and 30 s, not at every view


class ScriptedGrant(MemoryRegistry):
    """A registry whose grant does what the case says; revokes are recorded."""

    def __init__(self, grant: str, revoke: str = "ok") -> None:
        super().__init__()
        self.grant_does, self.revoke_does = grant, revoke
        self.revoked: list[int] = []

    async def grant(self, ttl: int) -> int:
        if self.grant_does == "full":
            raise RegistryFull(f"etcd /v3/lease/grant: {NOSPACE_MESSAGE} (HTTP 429, code 8)")
        if self.grant_does == "down":
            raise RegistryUnavailable("etcd /v3/lease/grant failed on every endpoint")
        if self.grant_does == "refused":
            raise Refused("etcd /v3/lease/grant: etcdserver: user name is empty", 3)
        if self.grant_does == "silent":
            await trio.sleep_forever()
        return await super().grant(ttl)

    async def revoke(self, lease: int) -> None:
        self.revoked.append(lease)
        if self.revoke_does == "down":
            raise RegistryUnavailable("etcd /v3/lease/revoke failed on every endpoint")
        await super().revoke(lease)


@pytest.mark.parametrize(
    ("grant", "revoke", "named", "revoked"),
    [
        pytest.param("full", "ok", True, 0, id="refused-for-space-is-named"),
        pytest.param("ok", "ok", False, 1, id="writes-pass-and-the-lease-is-revoked"),
        pytest.param("ok", "down", False, 1, id="a-lost-revoke-is-no-error"),
        pytest.param("down", "ok", False, 0, id="an-outage-is-no-evidence"),
        pytest.param("refused", "ok", False, 0, id="another-refusal-is-no-evidence"),
        pytest.param("silent", "ok", False, 0, id="no-answer-is-bounded-and-no-evidence"),
    ],
)
async def test_the_write_probe_names_only_a_refusal_for_space(
    grant: str, revoke: str, named: bool, revoked: int, autojump_clock: object
) -> None:
    registry = ScriptedGrant(grant, revoke)
    started = trio.current_time()
    refusal = await writes_refused(registry, 10)
    assert (refusal is not None) is named
    if named:
        assert refusal is not None and NOSPACE_MESSAGE in refusal
    assert len(registry.revoked) == revoked
    assert trio.current_time() - started <= PROBE_TIMEOUT
