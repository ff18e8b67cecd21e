"""The kernel data plane without a kernel: the messages it sends, the answers it
reads, and the choice ``--dataplane auto`` makes.

pyroute2's own encoder and decoder are the reference: each peer message packed by
``wg_netlink.set_requests`` is decoded by pyroute2's ``wgmsg`` (and is byte for byte
what ``AsyncWireGuard._wg_set_peer`` encodes), and device dumps are encoded by
pyroute2 as the kernel sends them and parsed by ``parse_dump``.
"""

from __future__ import annotations

import base64
import errno
import logging
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import replace
from ipaddress import ip_interface, ip_network
from typing import Any

import pytest
import trio
from pyroute2.netlink.generic.wireguard import (
    WGPEER_F_REMOVE_ME,
    WGPEER_F_REPLACE_ALLOWEDIPS,
    WGPEER_F_UPDATE_ONLY,
    AsyncWireGuard,
    wgmsg,
)

from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.kernel import device as kernel
from vnetd.dataplane.kernel import wg_netlink
from vnetd.dataplane.kernel.device import (
    KernelDataplane,
    device_attrs,
    handshake_messages,
    parse_dump,
    peer_messages,
)
from vnetd.dataplane.rtnetlink.pyroute2_package import NetlinkError
from vnetd.dataplane.select import choose_dataplane
from vnetd.errors import DataplaneError, VnetdError
from vnetd.model import DevicePeer, Peer, PeerUpdate, Plan
from vnetd.spec import parse_spec

KA = base64.b64encode(bytes([1] * 32)).decode()
KB = base64.b64encode(bytes([2] * 32)).decode()


def key_of(n: int) -> str:
    """A distinct well-formed public key per ``n``."""
    return base64.b64encode(n.to_bytes(2, "big") + bytes([7] * 30)).decode()


KC = base64.b64encode(bytes([3] * 32)).decode()
PRIVATE = base64.b64encode(bytes([9] * 32)).decode()


def config(keepalive: int = 0) -> DeviceConfig:
    return DeviceConfig(
        interface="vnet0",
        private_key=PRIVATE,
        listen_port=51820,
        address=ip_interface("10.250.0.1/16"),
        network=ip_network("10.250.0.0/16"),
        mtu=1420,
        persistent_keepalive=keepalive,
    )


def pyroute2_request(message: dict[str, Any]) -> bytes:
    """pyroute2's own ``WG_CMD_SET_DEVICE`` for one peer, after the netlink header."""
    msg = wgmsg()
    msg["cmd"] = 1
    msg["version"] = 1
    msg["attrs"].append(["WGDEVICE_A_IFNAME", "vnet0"])
    AsyncWireGuard._wg_set_peer(object.__new__(AsyncWireGuard), msg, message)
    msg.encode()
    return bytes(msg.data[16:])


def decoded(request: bytes) -> wgmsg:
    """A packed request as pyroute2 decodes it (a netlink header put in front)."""
    back = wgmsg(struct.pack("=IHHII", 16 + len(request), 0, 0, 0, 0) + request)
    back.decode()
    return back


def encoded(message: dict[str, Any]) -> dict[str, Any]:
    """The peer as the kernel receives it: packed here, decoded by pyroute2."""
    (request,) = wg_netlink.set_requests("vnet0", [message])
    (peer,) = decoded(request).get_attr("WGDEVICE_A_PEERS")
    out: dict[str, Any] = {
        "key": peer.get_attr("WGPEER_A_PUBLIC_KEY").decode(),
        "flags": peer.get_attr("WGPEER_A_FLAGS"),
    }
    if peer.get_attr("WGPEER_A_ENDPOINT"):
        ep = peer.get_attr("WGPEER_A_ENDPOINT")
        out["endpoint"] = (ep["family"], ep["addr"], ep["port"])
    if peer.get_attr("WGPEER_A_ALLOWEDIPS") is not None:
        out["allowed"] = [a["addr"] for a in peer.get_attr("WGPEER_A_ALLOWEDIPS")]
    if peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL") is not None:
        out["keepalive"] = peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL")
    return out


def test_plan_is_one_message_per_peer_in_order_remove_update_add() -> None:
    plan = Plan(
        remove=(Peer(KA, ("10.250.0.2/32",)),),
        update=(
            PeerUpdate(KB, endpoint="[fd00:198:18::3]:51821"),
            PeerUpdate(KC, allowed_ips=("10.250.0.4/32",), old_allowed_ips=("10.250.0.9/32",)),
        ),
        add=(Peer(KA, ("10.250.0.2/32", "fd00:250::2/128"), "198.18.0.2:51820"),),
    )
    assert [encoded(m) for m in peer_messages(plan, persistent_keepalive=25)] == [
        {"key": KA, "flags": WGPEER_F_REMOVE_ME},
        {
            "key": KB,
            "flags": WGPEER_F_UPDATE_ONLY,
            "endpoint": (socket.AF_INET6, "fd00:198:18::3", 51821),
        },
        {
            "key": KC,
            "flags": WGPEER_F_UPDATE_ONLY | WGPEER_F_REPLACE_ALLOWEDIPS,
            "allowed": ["10.250.0.4/32"],
        },
        {
            "key": KA,
            "flags": WGPEER_F_REPLACE_ALLOWEDIPS,
            "endpoint": (socket.AF_INET, "198.18.0.2", 51820),
            "allowed": ["10.250.0.2/32", "fd00:250::2/128"],
            "keepalive": 25,
        },
    ]


def test_add_without_endpoint_or_keepalive_sends_neither() -> None:
    (msg,) = peer_messages(Plan(add=(Peer(KA, ("10.250.0.2/32",)),)))
    assert encoded(msg) == {
        "key": KA,
        "flags": WGPEER_F_REPLACE_ALLOWEDIPS,
        "allowed": ["10.250.0.2/32"],
    }


def test_no_message_replaces_the_peer_list() -> None:
    plan = Plan(add=(Peer(KA, ("10.250.0.2/32",)), Peer(KB, ("10.250.0.3/32",))))
    for msg in peer_messages(plan):
        assert "replace_peers" not in msg
    # The device-level set carries only key and port, never a peer list.
    assert device_attrs(config()) == {"private_key": PRIVATE, "listen_port": 51820}


def test_handshake_turns_keepalive_off_on_and_back() -> None:
    msgs = [encoded(m) for m in handshake_messages([KA], persistent_keepalive=0)]
    assert [(m["flags"], m["keepalive"]) for m in msgs] == [
        (WGPEER_F_UPDATE_ONLY, 0),
        (WGPEER_F_UPDATE_ONLY, 1),
        (WGPEER_F_UPDATE_ONLY, 0),
    ]


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        pytest.param(Plan(add=(Peer("not-a-key", ("10.250.0.2/32",)),)), "public_key", id="key"),
        pytest.param(Plan(add=(Peer(KA, ("10.250.0.2/32",), "host:51820"),)), "endpoint", id="ep"),
    ],
)
def test_bad_input_is_a_dataplane_error(plan: Plan, match: str) -> None:
    with pytest.raises(DataplaneError, match=match):
        peer_messages(plan)


def dump(peers: list[list[Any]], private_key: str | None = PRIVATE) -> bytes:
    """A WG_CMD_GET_DEVICE answer as the kernel sends it, encoded by pyroute2."""
    msg = wgmsg()
    msg["cmd"] = 0
    msg["version"] = 1
    msg["attrs"] = [["WGDEVICE_A_IFNAME", "vnet0"], ["WGDEVICE_A_LISTEN_PORT", 51820]]
    if private_key:
        msg["attrs"].append(["WGDEVICE_A_PRIVATE_KEY", private_key])
    if peers:
        msg["attrs"].append(["WGDEVICE_A_PEERS", [{"attrs": attrs} for attrs in peers]])
    msg.encode()
    return bytes(msg.data)


def allowed(*cidrs: str) -> list[Any]:
    items = []
    for cidr in cidrs:
        net = ip_network(cidr)
        family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        items.append(
            {
                "attrs": [
                    ["WGALLOWEDIP_A_FAMILY", family],
                    ["WGALLOWEDIP_A_IPADDR", socket.inet_pton(family, str(net.network_address))],
                    ["WGALLOWEDIP_A_CIDR_MASK", net.prefixlen],
                ]
            }
        )
    return ["WGPEER_A_ALLOWEDIPS", items]


def test_parse_dump_reads_peers_and_merges_a_split_dump() -> None:
    first = dump(
        [
            [
                ["WGPEER_A_PUBLIC_KEY", KA],
                ["WGPEER_A_ENDPOINT", {"addr": "fd00:198:18::2", "port": 51820}],
                ["WGPEER_A_LAST_HANDSHAKE_TIME", {"tv_sec": 100, "tv_nsec": 500_000_000}],
                ["WGPEER_A_RX_BYTES", 10],
                ["WGPEER_A_TX_BYTES", 20],
                allowed("fd00:250::2/128"),
            ]
        ]
    )
    # The kernel continues a peer whose allowed IPs did not fit in the next message.
    second = dump(
        [
            [["WGPEER_A_PUBLIC_KEY", KA], allowed("10.250.0.2/32")],
            [
                ["WGPEER_A_PUBLIC_KEY", KB],
                ["WGPEER_A_ENDPOINT", {"addr": "198.18.0.3", "port": 51821}],
                allowed("10.250.0.3/32"),
            ],
        ],
        private_key=None,
    )
    key, port, peers = parse_dump([first, second + DONE])
    assert (key, port) == (PRIVATE, 51820)
    assert peers == {
        KA: DevicePeer(
            KA, ("10.250.0.2/32", "fd00:250::2/128"), "[fd00:198:18::2]:51820", 100.5, 10, 20
        ),
        KB: DevicePeer(KB, ("10.250.0.3/32",), "198.18.0.3:51821"),
    }


def test_parse_dump_of_an_empty_device() -> None:
    assert parse_dump([dump([])]) == (PRIVATE, 51820, {})


DONE = struct.pack("=IHHIIi", 20, 3, 2, 0, 0, 0)
"""NLMSG_DONE, as a dump ends (it may share a read with the last answer)."""


def test_a_request_is_byte_for_byte_pyroute2s_encoding() -> None:
    """Every kind of peer message: remove, endpoint update (v4, v6), allowed IPs moved,
    add with preshared key, keepalive and two families, the handshake's keepalive steps."""
    plan = Plan(
        remove=(Peer(KA, ("10.250.0.2/32",)),),
        update=(
            PeerUpdate(KB, endpoint="[fd00:198:18::3]:51821"),
            PeerUpdate(KC, "198.18.0.4:1", ("10.250.0.4/32",), ("10.250.0.9/32",)),
        ),
        add=(Peer(KA, ("10.250.0.2/32", "fd00:250::2/128", "10.9.0.0/16"), "198.18.0.2:51820"),),
    )
    messages = peer_messages(plan, 25, KC) + handshake_messages([KA], 25)
    for message in messages:
        assert wg_netlink.set_requests("vnet0", [message]) == [pyroute2_request(message)]


def test_many_peers_go_in_few_messages_each_within_the_chunk_in_order() -> None:
    """1000 adds in ceil(bytes / CHUNK) messages (not 1000), every peer once, in order,
    each message within ``CHUNK`` bytes of peers (pyroute2 decodes them all)."""
    messages = peer_messages(Plan(add=THOUSAND_PEERS))
    requests = wg_netlink.set_requests("vnet0", messages)
    assert 1 < len(requests) < 20
    keys = []
    for request in requests:
        assert len(request) <= wg_netlink.CHUNK + 64  # the genl header, the name, the nest
        keys += [
            p.get_attr("WGPEER_A_PUBLIC_KEY").decode()
            for p in decoded(request).get_attr("WGDEVICE_A_PEERS")
        ]
    assert keys == [peer.public_key for peer in THOUSAND_PEERS]


def test_a_peer_bigger_than_the_chunk_goes_alone() -> None:
    many = tuple(f"10.{i // 250}.{i % 250}.0/24" for i in range(600))  # 24 KB of allowed IPs
    messages = peer_messages(
        Plan(add=(Peer(KA, ("10.250.0.2/32",)), Peer(KB, many), Peer(KC, ("10.250.0.3/32",))))
    )
    requests = wg_netlink.set_requests("vnet0", messages)
    assert [len(decoded(r).get_attr("WGDEVICE_A_PEERS")) for r in requests] == [1, 1, 1]
    (big,) = decoded(requests[1]).get_attr("WGDEVICE_A_PEERS")
    assert len(big.get_attr("WGPEER_A_ALLOWEDIPS")) == 600


class FakeWireGuard:
    """Records the peers set; ``dump`` answers with the peers set so far (no kernel)."""

    def __init__(self, log: list[tuple[str, dict[str, Any]]]) -> None:
        self.log = log
        self.batches: list[int] = []
        """The peers of each ``set_peers`` call."""

    def set_device(self, interface: str, private_key: str, listen_port: int) -> None:
        raise AssertionError("no device-level set expected")

    def set_peers(self, interface: str, peers: Sequence[dict[str, Any]]) -> None:
        self.batches.append(len(peers))
        self.log.extend((interface, peer) for peer in peers)

    def held(self) -> list[list[Any]]:
        """The peers the sets so far leave on the device, as a dump's attributes."""
        peers: dict[str, list[Any]] = {}
        for _, peer in self.log:
            if peer.get("remove"):
                peers.pop(peer["public_key"], None)
            elif "allowed_ips" in peer:
                peers[peer["public_key"]] = [
                    ["WGPEER_A_PUBLIC_KEY", peer["public_key"]],
                    allowed(*peer["allowed_ips"]),
                ]
        return list(peers.values())

    def dump(self, interface: str) -> list[bytes]:
        return [dump(self.held())]

    def close(self) -> None:
        pass


async def test_apply_sends_each_peer_once_and_moves_routes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    routes: list[tuple[set[str], set[str]]] = []

    # Never touch this namespace's routes: record them instead.
    async def record(self: object, gone: set[str], new: set[str]) -> None:
        routes.append((gone, new))

    # the route move both real data planes share (linked_device.LinkedDevice)
    monkeypatch.setattr(
        "vnetd.dataplane.rtnetlink.linked_device.LinkedDevice._change_routes", record
    )
    dp = KernelDataplane(config(), None, lambda netns: FakeWireGuard(sent))
    a, b = Peer(KA, ("10.250.0.2/32",), rank=1), Peer(KB, ("10.250.0.3/32",), rank=2)
    with trio.fail_after(5):
        await dp.apply(Plan(add=(a, b)))
        await dp.apply(Plan(remove=(a,)))
        await dp.apply(Plan())
        peers = await dp.peers()
    assert [(ifname, p["public_key"], bool(p.get("remove"))) for ifname, p in sent] == [
        ("vnet0", KA, False),
        ("vnet0", KB, False),
        ("vnet0", KA, True),
    ]
    assert routes == [(set(), {"10.250.0.2/32", "10.250.0.3/32"}), ({"10.250.0.2/32"}, set())]
    assert set(peers) == {KB}


class SlowWireGuard(FakeWireGuard):
    """A kernel that takes ``delay`` s for every peer set (a slow or loaded node)."""

    delay = 0.0065

    def set_peers(self, interface: str, peers: Sequence[dict[str, Any]]) -> None:
        time.sleep(self.delay * len(peers))
        super().set_peers(interface, peers)


async def test_a_big_plan_gets_a_netlink_bound_that_grows_with_its_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1000 sets at 6.5 ms each (6.5 s) pass; one fixed 5 s bound for the whole plan
    failed it, and every retry of the same plan alike."""

    no_route_moves(monkeypatch)
    sent: list[tuple[str, dict[str, Any]]] = []
    dp = KernelDataplane(config(), None, lambda netns: SlowWireGuard(sent))
    with trio.fail_after(60):
        await dp.apply(Plan(add=THOUSAND_PEERS))
    assert len(sent) == 1000


THOUSAND_PEERS = tuple(
    Peer(key_of(i), (f"10.250.{2 + i // 250}.{1 + i % 250}/32",), rank=1 + i) for i in range(1000)
)
FIXED_BOUND = 0.5
"""``NETLINK_TIMEOUT`` in the tests that go past it: the fixed part of a bound, scaled
down from 5 s so that they need not sleep as long (the allowances are the real ones)."""


def no_route_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    async def none(self: object, gone: set[str], new: set[str]) -> None:
        pass

    monkeypatch.setattr("vnetd.dataplane.rtnetlink.linked_device.LinkedDevice._change_routes", none)


class SlowDump(FakeWireGuard):
    """A kernel whose dump takes ``per_peer`` s for each peer it holds (pyroute2 decodes
    peer by peer: a loaded TCG guest took more than 5 s for 1000)."""

    per_peer = FIXED_BOUND * 1.1 / 1000

    def dump(self, interface: str) -> list[bytes]:
        peers = self.held()
        time.sleep(self.per_peer * len(peers))
        # Over several messages, as the kernel splits a dump.
        return [dump(peers[start : start + 100]) for start in range(0, len(peers), 100)]


async def test_a_dump_gets_a_netlink_bound_that_grows_with_the_peers_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1000 peers dumped in 1.1 times the fixed bound, after the join and inside a
    departure's plan (which reads the device back): a fixed bound failed both, and every
    retry alike (5 s, against 5.5 s in a loaded guest; scaled down here)."""
    monkeypatch.setattr(kernel, "NETLINK_TIMEOUT", FIXED_BOUND)
    no_route_moves(monkeypatch)
    sent: list[tuple[str, dict[str, Any]]] = []
    dp = KernelDataplane(config(), None, lambda netns: SlowDump(sent))
    with trio.fail_after(60):
        await dp.apply(Plan(add=THOUSAND_PEERS))
        assert len(await dp.peers()) == 1000
        await dp.apply(Plan(remove=THOUSAND_PEERS[:1]))
    assert dp.known_peers == 999


def test_the_first_dump_of_an_adopted_link_is_bounded_by_the_mesh_size() -> None:
    """A restarted daemon cannot know the peers of the link it adopts: the mesh's size
    bounds them (``DeviceConfig.max_peers``, the size less one)."""
    small = KernelDataplane(config(), None, FakeWireGuard)
    big = KernelDataplane(replace(config(), max_peers=1023), None, FakeWireGuard)
    assert small._dump_bound() == kernel.NETLINK_TIMEOUT
    assert big._dump_bound() == kernel.NETLINK_TIMEOUT + 1023 * kernel.DUMP_ALLOWANCE


class TakesDeviceSets(FakeWireGuard):
    """Also takes the device-level set (private key and port) that ``open`` sends."""

    def set_device(self, interface: str, private_key: str, listen_port: int) -> None:
        pass


async def test_an_adopted_link_is_configured_within_a_bound_that_grows_with_the_mesh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Configuring a link reads the namespace's routes: an adopted link brings one per
    peer, 1000 decoded in 1.1 times the fixed bound here (5.5 s in a loaded guest, where
    the fixed 5 s bound failed the restart; scaled down here)."""

    async def slow_set_up(
        netns: str | None, config: DeviceConfig, timeout: float
    ) -> tuple[int, bool]:
        with trio.fail_after(timeout):  # as the link socket bounds each request
            await trio.sleep(FIXED_BOUND * 1.1 / 1000 * config.max_peers)
        return 7, True

    async def repaired(self: object, peers: object) -> None:
        pass

    monkeypatch.setattr(kernel, "NETLINK_TIMEOUT", FIXED_BOUND)
    monkeypatch.setattr(kernel, "link_kind", lambda netns, name: "wireguard")
    monkeypatch.setattr(kernel, "set_up_link", slow_set_up)
    monkeypatch.setattr(
        "vnetd.dataplane.rtnetlink.linked_device.LinkedDevice._repair_adopted", repaired
    )
    sent: list[tuple[str, dict[str, Any]]] = []
    dp = KernelDataplane(replace(config(), max_peers=1000), None, lambda n: TakesDeviceSets(sent))
    with trio.fail_after(60):
        assert await dp.open() is True
    assert dp.index == 7


class RefusingWireGuard(FakeWireGuard):
    """Takes the first peer of a batch, then refuses (as a set failing part-way does:
    the kernel applies a message's peers in order and stops at the refused one)."""

    def set_peers(self, interface: str, peers: Sequence[dict[str, Any]]) -> None:
        super().set_peers(interface, peers[:1])
        raise NetlinkError(errno.EINVAL, "refused")


async def test_a_change_that_failed_part_way_has_its_routes_repaired_at_the_next_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 9: a peer the refused batch left on the device gets its route when the
    device is next read (the pass after a failure plans nothing for it: it is there)."""
    routes: list[tuple[set[str], set[str]]] = []
    synced: list[int] = []

    async def record(self: object, gone: set[str], new: set[str]) -> None:
        routes.append((gone, new))

    def read_routes(netns: str | None, index: int) -> set[str]:
        synced.append(index)
        return set()

    monkeypatch.setattr(
        "vnetd.dataplane.rtnetlink.linked_device.LinkedDevice._change_routes", record
    )
    monkeypatch.setattr("vnetd.dataplane.rtnetlink.linked_device.device_routes", read_routes)
    sent: list[tuple[str, dict[str, Any]]] = []
    dp = KernelDataplane(config(), None, lambda netns: RefusingWireGuard(sent))
    dp.index = 7
    a, b = Peer(KA, ("10.250.0.2/32",), rank=1), Peer(KB, ("10.250.0.3/32",), rank=2)
    with trio.fail_after(5):
        with pytest.raises(DataplaneError, match="refused"):
            await dp.apply(Plan(add=(a, b)))
        assert routes == [] and synced == []
        assert set(await dp.peers()) == {KA}
        await dp.peers()
    assert synced == [7]  # once: the next read finds nothing unsure
    assert routes == [(set(), {"10.250.0.2/32"})]


# --- the choice -------------------------------------------------------------------------


def spec(dataplane: str | None = None) -> Any:  # noqa: ANN401
    data: dict[str, Any] = {"mesh": {"name": "m", "size": 2, "network": "10.250.0.0/16"}}
    if dataplane:
        data["wireguard"] = {"dataplane": dataplane}
    return parse_spec(data)


def probe_says(monkeypatch: pytest.MonkeyPatch, link: str | None, reason: str | None) -> None:
    async def existing(netns: str | None, name: str) -> str | None:
        return link

    async def unavailable(netns: str | None = None) -> str | None:
        return reason

    monkeypatch.setattr("vnetd.dataplane.rtnetlink.link_reads.existing_link_kind", existing)
    monkeypatch.setattr("vnetd.dataplane.rtnetlink.link.kernel_unavailable", unavailable)


NO_MODULE = "creating a wireguard link: Operation not supported (no wireguard kernel module)"


def factory_name(factory: Any) -> str:  # noqa: ANN401
    return str(factory.__name__)


@pytest.mark.parametrize(
    ("flag", "configured", "link", "reason", "chosen", "logged"),
    [
        pytest.param(
            None,
            None,
            None,
            NO_MODULE,
            "open_uapi_dataplane",
            f"kernel WireGuard unavailable ({NO_MODULE}); using wireguard-go",
            id="auto-falls-back",
        ),
        pytest.param(
            "auto",
            None,
            None,
            None,
            "open_kernel_dataplane",
            "kernel WireGuard (auto: a wireguard link can be created)",
            id="auto-kernel",
        ),
        pytest.param(
            None,
            "auto",
            "wireguard",
            NO_MODULE,
            "open_kernel_dataplane",
            "kernel (auto: vnet0 already has a wireguard link)",
            id="auto-adopts-kernel-link",
        ),
        pytest.param(
            "auto",
            None,
            "tun",
            None,
            "open_uapi_dataplane",
            "userspace (auto: vnet0 already has a tun link)",
            id="auto-adopts-wireguard-go",
        ),
        pytest.param(
            None,
            "userspace",
            None,
            None,
            "open_uapi_dataplane",
            "userspace ([wireguard] dataplane userspace)",
            id="spec-userspace",
        ),
        pytest.param(
            "userspace",
            "kernel",
            None,
            None,
            "open_uapi_dataplane",
            "userspace (--dataplane userspace)",
            id="flag-wins",
        ),
        pytest.param(
            "kernel",
            None,
            None,
            None,
            "open_kernel_dataplane",
            "kernel (--dataplane kernel)",
            id="kernel",
        ),
    ],
)
async def test_choice(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    flag: str | None,
    configured: str | None,
    link: str | None,
    reason: str | None,
    chosen: str,
    logged: str,
) -> None:
    caplog.set_level(logging.INFO, logger="vnetd.daemon")
    probe_says(monkeypatch, link, reason)
    factory = await choose_dataplane(flag, spec(configured), "vnet0")
    assert factory_name(factory) == chosen
    assert f"data plane: {logged}" in caplog.messages


async def test_kernel_asked_for_but_unavailable_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe_says(monkeypatch, None, NO_MODULE)
    with pytest.raises(VnetdError) as err:
        await choose_dataplane(None, spec("kernel"), "vnet0")
    assert str(err.value) == (
        f"[wireguard] dataplane: kernel WireGuard unavailable ({NO_MODULE}); "
        "use auto or userspace (wireguard-go)"
    )


def test_spec_dataplane_is_local_not_part_of_the_mesh() -> None:
    assert spec("kernel").canonical_json() == spec("userspace").canonical_json()
    with pytest.raises(VnetdError, match=r"wireguard.dataplane: 'wg' is not one of auto"):
        spec("wg")


class SilentWireGuard(FakeWireGuard):
    """A socket whose answer never comes (its read times out)."""

    def set_peers(self, interface: str, peers: Sequence[dict[str, Any]]) -> None:
        raise TimeoutError("timed out")


async def test_a_socket_that_times_out_is_a_dataplane_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciler retries a DataplaneError; an OSError would end the daemon."""
    no_route_moves(monkeypatch)
    dp = KernelDataplane(config(), None, lambda netns: SilentWireGuard([]))
    with trio.fail_after(5), pytest.raises(DataplaneError, match="wireguard socket: timed out"):
        await dp.apply(Plan(add=THOUSAND_PEERS[:1]))


async def test_a_plan_goes_to_the_socket_as_one_batch_and_its_handshakes_as_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One ``set_peers`` for the whole plan (packed many peers to a message), not one
    call per peer: 1000 adds; then, once the routes are in, one for the three
    keepalive steps of one handshake (tests/contract/test_dataplane.py checks that
    order against the kernel)."""
    no_route_moves(monkeypatch)
    fakes: list[FakeWireGuard] = []

    def factory(netns: str | None) -> FakeWireGuard:
        fakes.append(FakeWireGuard([]))
        return fakes[-1]

    dp = KernelDataplane(config(), None, factory)
    with trio.fail_after(30):
        await dp.apply(Plan(add=THOUSAND_PEERS, handshake=(THOUSAND_PEERS[0].public_key,)))
    assert [fake.batches for fake in fakes] == [[1000], [3]]
