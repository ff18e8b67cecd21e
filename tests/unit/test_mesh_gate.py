"""The MiniCluster's mesh gate: the ranks a broker needs (``wait.gate.tbon_neighbours``),
a foreign sidecar told from the pod's listening ports (``doctor.sidecars``), and what
``/gatez`` answers (``observe.gate``): open, not yet, refused, and the doctor's verdict."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import trio
import trio.lowlevel
from shared import wide_key as key

from vnetd.asgi import Message
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView
from vnetd.doctor.evidence import PeerSeen, Row
from vnetd.doctor.sidecars import foreign_proxies, listening_ports
from vnetd.model import DevicePeer, Member
from vnetd.observe.gate import REFUSED, MeshGate
from vnetd.observe.http import App, Check
from vnetd.spec import parse_spec
from vnetd.wait.gate import tbon_neighbours

SPEC = parse_spec({"mesh": {"name": "unit", "size": 3, "network": "10.250.0.0/16"}})

# /proc/net/tcp as the kernel writes it: local address and port in hex, state 0A listening.
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
ISTIO = HEADER + (
    "   0: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337\n"
    "   1: 00000000:3A9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337\n"
    "   2: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337\n"
    "   3: 0A000005:3A99 0A000009:D431 01 00000000:00000000 00:00000000 00000000  1337\n"
)
LINKERD_6 = (
    "  sl  local_address                         remote_address                        st\n"
    "   0: 00000000000000000000000000000000:102F 00000000000000000000000000000000:0000 0A\n"
)
LINKERD_4 = HEADER + (
    "   0: 0100007F:102C 00000000:0000 0A 00000000:00000000 00:00000000 00000000  2102\n"
)
VNETD_ONLY = HEADER + (
    "   0: 00000000:0FAC 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
    "   1: 0A000005:3A9E 0A000009:D431 01 00000000:00000000 00:00000000 00000000     0\n"
)


@pytest.mark.parametrize(
    ("rank", "size", "fanout", "needed"),
    [
        pytest.param(0, 3, 256, (1, 2), id="root-of-a-flat-tree"),
        pytest.param(2, 3, 256, (0,), id="leaf-of-a-flat-tree"),
        pytest.param(0, 1, 256, (), id="a-single-broker"),
        pytest.param(1, 600, 256, (0, *range(257, 513)), id="inner-broker"),
        pytest.param(300, 600, 256, (1,), id="leaf-under-an-inner-broker"),
        pytest.param(1, 7, 2, (0, 3, 4), id="binary-tree"),
    ],
)
def test_a_broker_needs_its_parent_and_children(
    rank: int, size: int, fanout: int, needed: tuple[int, ...]
) -> None:
    assert tbon_neighbours(rank, size, fanout) == needed


@pytest.mark.parametrize(
    ("tables", "names"),
    [
        pytest.param([ISTIO], ["Istio's sidecar proxy (envoy)"], id="istio"),
        pytest.param([LINKERD_4, LINKERD_6], ["Linkerd's proxy (linkerd2-proxy)"], id="linkerd"),
        pytest.param([LINKERD_4], [], id="one-port-alone-is-no-proxy"),
        pytest.param([VNETD_ONLY], [], id="a-connection-is-not-a-listener"),
        pytest.param(["garbage\n:\n"], [], id="unparsable"),
    ],
)
def test_a_foreign_proxy_is_told_by_both_its_capture_ports(
    tables: list[str], names: list[str]
) -> None:
    assert [proxy.name for proxy in foreign_proxies(listening_ports(tables))] == names


@dataclass
class FakeDevice:
    peers_now: dict[str, DevicePeer] = field(default_factory=dict)

    async def peers(self) -> dict[str, DevicePeer]:
        return self.peers_now


@dataclass
class Running:
    view: MemberView
    dataplane: Any
    health: RegistryHealth = field(default_factory=RegistryHealth)


def member(rank: int) -> Member:
    return Member(rank, key(rank), f"198.18.0.{rank + 1}:51820", f"pod{rank}")


def running(ranks: list[int], handshakes: list[int]) -> Running:
    view = MemberView()
    view.members = {rank: member(rank) for rank in ranks}
    view.synced = True
    peers = {
        key(rank): DevicePeer(key(rank), (f"10.250.0.{rank + 1}/32",),
                              f"198.18.0.{rank + 1}:51820",
                              last_handshake=1.0 if rank in handshakes else 0.0)
        for rank in ranks if rank != 0
    }  # fmt: skip
    return Running(view, FakeDevice(peers))


def blocked_rows(ranks: list[int], helpers: list[int], deadline: float) -> dict[int, Row]:
    """UDP between rank 0's and rank 1's pods dropped: rank 0 sent, nothing came back;
    rank 2 (the helper) reaches rank 1."""
    assert helpers == [2]
    seen = {r: PeerSeen(r, key(r), f"198.18.0.{r + 1}:51820", None, 0, 444) for r in ranks}
    fine = {r: PeerSeen(r, key(r), f"198.18.0.{r + 1}:51820", 2.0, 900, 900, 0.001, 0.001)
            for r in ranks}  # fmt: skip
    return {0: Row(0, "pod0", key(0), 1420, seen), 2: Row(2, "pod2", key(2), 1420, fine)}


async def test_the_gate_opens_once_every_needed_rank_has_a_handshake() -> None:
    gate = MeshGate(SPEC, member(0), lambda: [VNETD_ONLY])
    waiting = await gate.check(running([0, 1, 2], [2]), 256, verdict=False)
    assert (waiting.ok, waiting.status) == (False, None)
    assert waiting.detail == "rank 0: 3/3 ranks registered; 1/2 peers reachable, no handshake: 1"
    assert (await gate.check(running([0, 1, 2], [1, 2]), 256, verdict=False)).ok
    leaf = MeshGate(SPEC, member(2), lambda: [VNETD_ONLY])
    assert not (await leaf.check(running([0, 1, 2], []), 256, verdict=False)).ok
    assert (await leaf.check(None, 256, verdict=False)).detail == "rank 2: vnetd is starting"


async def test_a_rank_behind_a_gateway_is_reached_by_the_gateways_handshake() -> None:
    """Rank 3 is of another site: rank 0's device holds its address on rank 2's peer (the
    gateway's), so the gateway's handshake is what reaches it; it has no peer of its own."""
    spec = parse_spec({"mesh": {"name": "unit", "size": 4, "network": "10.250.0.0/16"}})
    gateway = DevicePeer(key(2), ("10.250.0.3/32", "10.250.0.4/32"), "198.18.0.3:51820", 1.0)
    direct = DevicePeer(key(1), ("10.250.0.2/32",), "198.18.0.2:51820", 1.0)
    view = MemberView()
    view.members = {rank: member(rank) for rank in range(4)}
    view.synced = True
    gate = MeshGate(spec, member(0), lambda: [VNETD_ONLY])
    opened = await gate.check(
        Running(view, FakeDevice({key(1): direct, key(2): gateway})), 256, verdict=False
    )
    assert opened.ok, opened.detail
    silent = replace(gateway, last_handshake=0.0)
    shut = await gate.check(
        Running(view, FakeDevice({key(1): direct, key(2): silent})), 256, verdict=False
    )
    assert shut.detail == "rank 0: 4/4 ranks registered; 1/3 peers reachable, no handshake: 2, 3"


async def test_the_verdict_names_the_silent_ranks_and_blocked_udp() -> None:
    spec = parse_spec({"mesh": {"name": "unit", "size": 4, "network": "10.250.0.0/16"}})
    gate = MeshGate(spec, member(0), lambda: [VNETD_ONLY])
    gate.row_source = trio_rows(blocked_rows)
    check = await gate.check(running([0, 1, 2], [2]), 256, verdict=True)
    lines = check.detail.splitlines()
    assert lines[0] == (
        "rank 0: 3/4 ranks registered, missing: 3; 1/3 peers reachable, no handshake: 1"
    )
    assert (
        "0 → 1    no_handshake: UDP blocked: no WireGuard handshake completes between "
        "ranks 0 and 1: UDP port 51820 between their pods is dropped" in check.detail
    )
    assert "0 → 3    not_registered: rank 3 has no entry in the registry" in check.detail
    assert "0 → 2" not in check.detail


async def test_a_rank_no_prober_ever_reached_is_named_with_udp() -> None:
    gate = MeshGate(SPEC, member(0), lambda: [VNETD_ONLY])

    async def alone(ranks: list[int], helpers: list[int], deadline: float) -> dict[int, Row]:
        await trio.lowlevel.checkpoint()
        return {0: blocked_rows(ranks, [2], deadline)[0]}

    gate.row_source = alone
    check = await gate.check(running([0, 1], []), 256, verdict=True)
    assert "0 → 1    held_silent:" in check.detail
    assert "(never reached: UDP port 51820 to it blocked?)" in check.detail


async def test_a_foreign_sidecar_refuses_the_gate_at_once() -> None:
    gate = MeshGate(SPEC, member(0), lambda: [ISTIO])
    check = await gate.check(running([0, 1, 2], [1, 2]), 256, verdict=False)
    assert (check.ok, check.status) == (False, REFUSED)
    assert check.detail.startswith(
        "foreign sidecar in this pod: Istio's sidecar proxy (envoy) listens on its capture "
        "ports (TCP 15001 and 15006): its capture takes Flux's TCP on vnet0"
    )
    assert "sidecar.istio.io/inject" in check.detail and "\n" not in check.detail


def trio_rows(build: Any) -> Any:  # noqa: ANN401 - a RowSource
    async def rows(ranks: list[int], helpers: list[int], deadline: float) -> dict[int, Row]:
        await trio.lowlevel.checkpoint()
        return dict(build(ranks, helpers, deadline))

    return rows


class GateEndpoints:
    def __init__(self) -> None:
        self.asked: list[tuple[int, bool]] = []

    async def health(self) -> Check:
        return Check(True, "ok")

    async def ready(self) -> Check:
        return Check(True, "ok")

    async def metrics(self) -> bytes:
        return b""

    async def status(self) -> dict[str, Any]:
        return {}

    async def gate(self, fanout: int, verdict: bool) -> Check:
        self.asked.append((fanout, verdict))
        return Check(False, "refused", REFUSED) if verdict else Check(True, "open")


async def get(app: App, target: str, client: tuple[str, int]) -> tuple[int, bytes]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    path, _, query = target.partition("?")
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(),
             "client": client}  # fmt: skip
    await app(scope, receive, send)
    return int(sent[0]["status"]), bytes(sent[1]["body"])


async def test_gatez_answers_the_pod_only_with_the_gates_status() -> None:
    endpoints = GateEndpoints()
    app = App(endpoints)
    loopback = ("127.0.0.1", 1)
    assert await get(app, "/gatez?fanout=256", loopback) == (200, b"open\n")
    assert await get(app, "/gatez?fanout=256&verdict=1", loopback) == (409, b"refused\n")
    assert (await get(app, "/gatez?fanout=0", loopback))[0] == 400
    assert (await get(app, "/gatez?fanout=x", loopback))[0] == 400
    assert (await get(app, "/gatez", ("10.1.2.3", 1)))[0] == 403
    assert endpoints.asked == [(256, False), (256, True)]
