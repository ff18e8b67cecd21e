"""Readiness rules, the metrics exposition, and the HTTP app (served on loopback)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from vnetd.control.claim import ClaimState
from vnetd.model import DevicePeer
from vnetd.observe.http import Check, serve_http
from vnetd.observe.metrics import DaemonMetrics, Snapshot
from vnetd.observe.readiness import LinkState, readiness

ADDR = "10.250.0.2"


UP = LinkState(True, True, frozenset({ADDR}))


@pytest.mark.parametrize(
    ("link", "claim", "ok", "why"),
    [
        pytest.param(LinkState(False), "claimed", False, "does not exist", id="no-interface"),
        pytest.param(LinkState(True, True), "claimed", False, "does not hold", id="no-address"),
        pytest.param(
            LinkState(True, True, frozenset({"10.250.0.3"})), "claimed", False, "does not hold",
            id="another-address",
        ),
        pytest.param(LinkState(True, False, frozenset({ADDR})), "claimed", False, "down", id="down"),
        pytest.param(UP, "claiming", False, "not claimed", id="unclaimed"),
        pytest.param(UP, "waiting", False, "rank 1 is held by pod9; waiting", id="waiting"),
        pytest.param(UP, "displaced", False, "displaced: rank 1 was taken by pod9", id="displaced"),
        pytest.param(UP, "claimed", True, "ready", id="ready"),
    ],
)  # fmt: skip
def test_readiness(link: LinkState, claim: ClaimState, ok: bool, why: str) -> None:
    check = readiness(link, "vnet0", ADDR, claim, 1, "pod9")
    assert check.ok is ok
    assert why in check.detail


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        pytest.param("claiming", "rank 1 is not claimed: registry full", id="full-names-why"),
        pytest.param("waiting", "rank 1 is held by pod9", id="a-holder-comes-first"),
        pytest.param("claimed", "ready", id="claimed-stays-ready-while-full"),
    ],
)
def test_readiness_names_a_full_registry_that_keeps_the_claim_waiting(
    claim: ClaimState, why: str
) -> None:
    check = readiness(UP, "vnet0", ADDR, claim, 1, "pod9", "registry full: etcd refuses writes")
    assert why in check.detail
    assert check.ok is (claim == "claimed")


def test_readiness_compares_ipv6_addresses_in_any_notation() -> None:
    link = LinkState(True, True, frozenset({"fd00:250:0:0::2"}))
    assert readiness(link, "vnet0", "fd00:250::2", "claimed").ok


def scrape(metrics: DaemonMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_report_the_snapshot() -> None:
    now = time.time()
    peers = {
        "k1": DevicePeer("k1", ("10.250.0.2/32",), last_handshake=now - 10),
        "k2": DevicePeer("k2", ("10.250.0.3/32",), last_handshake=now - 400),
        "k3": DevicePeer("k3", ("10.250.0.4/32",)),
    }
    metrics = DaemonMetrics()
    metrics.update(
        Snapshot(
            members=4,
            peers=peers,
            peer_ranks={"k1": 1, "k2": 2, "k3": 3},
            reconcile_runs=7,
            bad_entries=2,
            watch_restarts=1,
            claims=3,
            registry_errors={"watch": 5, "keepalive": 1},
            wireguard_restarts=1,
            now=now,
        )
    )
    metrics.observe_pass(0.004, 3)
    metrics.observe_pass(0.002, 0)
    s = scrape(metrics)
    assert s[("vnetd_members_registered", ())] == 4
    assert s[("vnetd_peers_configured", ())] == 3
    assert s[("vnetd_peers_handshake_fresh", ())] == 1
    assert s[("vnetd_peer_last_handshake_seconds", (("rank", "1"),))] == pytest.approx(10)
    assert s[("vnetd_peer_last_handshake_seconds", (("rank", "2"),))] == pytest.approx(400)
    assert ("vnetd_peer_last_handshake_seconds", (("rank", "3"),)) not in s  # never
    assert s[("vnetd_reconcile_runs_total", ())] == 7
    assert s[("vnetd_registry_errors_total", (("operation", "watch"),))] == 5
    assert s[("vnetd_registry_bad_entries_total", ())] == 2
    assert s[("vnetd_watch_restarts_total", ())] == 1
    assert s[("vnetd_lease_reclaims_total", ())] == 2
    assert s[("vnetd_wireguard_restarts_total", ())] == 1
    assert s[("vnetd_reconcile_duration_seconds_count", ())] == 2
    assert s[("vnetd_plan_changes_count", ())] == 1  # the empty pass applied nothing
    assert s[("vnetd_plan_changes_sum", ())] == 3


def test_two_daemons_in_one_process_have_separate_metrics() -> None:
    a, b = DaemonMetrics(), DaemonMetrics()
    a.update(Snapshot(members=5))
    b.update(Snapshot(members=1))
    assert scrape(a)[("vnetd_members_registered", ())] == 5
    assert scrape(b)[("vnetd_members_registered", ())] == 1


class FakeEndpoints:
    def __init__(self) -> None:
        self.ready_now = False

    async def health(self) -> Check:
        return Check(True, "ok: alive")

    async def ready(self) -> Check:
        return Check(self.ready_now, "ready" if self.ready_now else "not ready: starting")

    async def metrics(self) -> bytes:
        metrics = DaemonMetrics()
        metrics.update(Snapshot(members=2))
        return metrics.exposition()

    async def status(self) -> dict[str, Any]:
        return {"rank": 0, "registered": [0, 1]}


async def test_http_endpoints_on_loopback() -> None:
    endpoints = FakeEndpoints()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_http, "127.0.0.1:0", endpoints)
            base = bound[0]  # "http://127.0.0.1:PORT"
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:
                assert (await client.get("/healthz")).status_code == 200
                not_ready = await client.get("/readyz")
                assert (not_ready.status_code, not_ready.text) == (503, "not ready: starting\n")
                endpoints.ready_now = True
                assert (await client.get("/readyz")).status_code == 200
                metrics = await client.get("/metrics")
                assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
                assert "vnetd_members_registered 2.0" in metrics.text
                status = await client.get("/status")
                assert json.loads(status.text) == {"rank": 0, "registered": [0, 1]}
                assert (await client.get("/nope")).status_code == 404
                assert (await client.post("/readyz")).status_code == 405
                head = await client.head("/healthz")
                assert (head.status_code, head.content) == (200, b"")
            nursery.cancel_scope.cancel()


async def test_daemon_endpoints_before_and_after_the_device() -> None:
    from ipaddress import ip_interface, ip_network

    from vnetd.dataplane.base import DeviceConfig
    from vnetd.dataplane.fake import FakeDataplane
    from vnetd.model import Member
    from vnetd.observe.endpoints import DaemonEndpoints
    from vnetd.spec import parse_spec

    spec = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}})
    me = Member(rank=1, public_key="k", endpoint="198.18.1.1:51820", instance="pod1")
    endpoints = DaemonEndpoints(spec, me, DaemonMetrics())
    assert (await endpoints.ready()).detail.startswith("not ready: starting")
    assert (await endpoints.health()).ok
    assert (await endpoints.status())["self"]["claimed"] is False
    assert b"vnetd_members_registered" in await endpoints.metrics()

    config = DeviceConfig(
        interface="vnet0",
        private_key=base64_key(),
        listen_port=51820,
        address=ip_interface("10.250.0.2/16"),
        network=ip_network("10.250.0.0/16"),
        mtu=1420,
    )
    device = FakeDataplane(config)
    endpoints.attach_dataplane(device)
    check = await endpoints.ready()
    assert (check.ok, check.detail) == (
        False,
        "not ready: the rank is not claimed yet (see the log for who holds it)",
    )
    device.close()
    assert "does not exist" in (await endpoints.ready()).detail


def base64_key() -> str:
    import base64

    return base64.b64encode(bytes(range(1, 33))).decode()


async def test_dual_stack_daemon_is_ready_only_with_both_addresses() -> None:
    from ipaddress import IPv6Interface, IPv6Network, ip_interface, ip_network

    from vnetd.dataplane.base import DeviceConfig
    from vnetd.dataplane.fake import FakeDataplane
    from vnetd.model import Member
    from vnetd.observe.endpoints import DaemonEndpoints
    from vnetd.spec import parse_spec

    spec = parse_spec(
        {"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16", "network6": "fd00:250::/64"}}
    )
    me = Member(rank=1, public_key="k", endpoint="198.18.1.1:51820", instance="pod1")
    endpoints = DaemonEndpoints(spec, me, DaemonMetrics())
    status = await endpoints.status()
    assert (status["self"]["address"], status["self"]["addresses"]) == (
        "10.250.0.2",
        ["10.250.0.2", "fd00:250::2"],
    )
    assert status["network6"] == "fd00:250::/64"
    only4 = DeviceConfig("vnet0", base64_key(), 51820, ip_interface("10.250.0.2/16"),
                         ip_network("10.250.0.0/16"), 1420)  # fmt: skip
    endpoints.attach_dataplane(FakeDataplane(only4))
    assert (await endpoints.ready()).detail == "not ready: vnet0 does not hold fd00:250::2 yet"
    both = DeviceConfig("vnet0", base64_key(), 51820, ip_interface("10.250.0.2/16"),
                        ip_network("10.250.0.0/16"), 1420,
                        address6=IPv6Interface("fd00:250::2/64"),
                        network6=IPv6Network("fd00:250::/64"))  # fmt: skip
    endpoints.attach_dataplane(FakeDataplane(both))
    assert (await endpoints.ready()).detail.startswith("not ready: the rank is not claimed yet")
