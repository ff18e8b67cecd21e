"""The read-side device port without a kernel module: ``read_device`` over a UAPI
socket and over a fake kernel, and ``vnetd status`` / ``vnetd wait --reachable``
on the kernel's code path.

The fake kernel answers a dump with messages encoded by pyroute2's real
``wgmsg`` codec, as the kernel sends them (device attributes in the first
message, the peers split over two), so ``kernel.parse_dump`` reads what it
would read from a real device.
"""

from __future__ import annotations

import base64
import errno
import io
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic.wireguard import AsyncWireGuard, wgmsg
from shared import create_leased, key

from vnetd.commands.status.plan import StatusPlan
from vnetd.commands.status.show import show_status
from vnetd.commands.wait.command import WaitOptions, plan_wait, run_wait
from vnetd.control.membership import encode_member, member_key
from vnetd.dataplane.codec.uapi_protocol import GET_REQUEST
from vnetd.dataplane.device_reader import LocalDevice, read_device
from vnetd.dataplane.kernel.device import split_endpoint
from vnetd.errors import DataplaneError
from vnetd.keys import public_key_of
from vnetd.model import DevicePeer, Member
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec
from vnetd.status.table import plain_console

NOW = 1_700_000_000.0
PRIVATE_KEY = base64.b64encode(bytes(range(1, 33))).decode()
DEVICE_KEY = public_key_of(PRIVATE_KEY)
PORT = 51820

SPEC_TEXT = """
[mesh]
name = "unit"
size = 4
network = "10.250.0.0/16"
network6 = "fd00:250::/64"
hostname = "unit-{rank}"
[registry]
endpoints = ["http://127.0.0.1:1"]
"""


PEERS = (
    DevicePeer(
        key(1), ("10.250.0.2/32", "fd00:250::2/128"), "198.18.1.1:51820", NOW - 10.25, 2048, 4096
    ),
    DevicePeer(key(2), ("10.250.0.3/32", "fd00:250::3/128"), "[fd00:198:18::2]:51821"),
    DevicePeer(key(3), ("10.250.0.4/32", "fd00:250::4/128"), None, NOW - 3600.5, 1, 2),
)


# --- the two answers for the same peers --------------------------------------------------


def uapi_answer(peers: Sequence[DevicePeer], private_key: str = PRIVATE_KEY) -> bytes:
    """A wireguard-go ``get`` answer, in its order (the private key first)."""
    lines = [f"private_key={base64.b64decode(private_key).hex()}", f"listen_port={PORT}"]
    for peer in peers:
        lines.append(f"public_key={base64.b64decode(peer.public_key).hex()}")
        lines.append("protocol_version=1")
        if peer.endpoint is not None:
            lines.append(f"endpoint={peer.endpoint}")
        seconds = int(peer.last_handshake)
        nanoseconds = round((peer.last_handshake - seconds) * 1e9)
        lines += [f"last_handshake_time_sec={seconds}", f"last_handshake_time_nsec={nanoseconds}"]
        lines += [f"tx_bytes={peer.tx_bytes}", f"rx_bytes={peer.rx_bytes}"]
        lines.append("persistent_keepalive_interval=0")
        lines += [f"allowed_ip={ip}" for ip in peer.allowed_ips]
    return ("\n".join([*lines, "errno=0"]) + "\n\n").encode()


def _peer_attrs(peer: DevicePeer) -> list[Any]:
    seconds = int(peer.last_handshake)
    attrs: list[Any] = [
        ["WGPEER_A_PUBLIC_KEY", peer.public_key],
        ["WGPEER_A_LAST_HANDSHAKE_TIME",
         {"tv_sec": seconds, "tv_nsec": round((peer.last_handshake - seconds) * 1e9)}],
        ["WGPEER_A_RX_BYTES", peer.rx_bytes],
        ["WGPEER_A_TX_BYTES", peer.tx_bytes],
    ]  # fmt: skip
    if peer.endpoint is not None:
        addr, port = split_endpoint(peer.endpoint)
        attrs.append(["WGPEER_A_ENDPOINT", {"addr": addr, "port": port}])
    # pyroute2's own encoding of allowed IPs (the method uses no state).
    allowed = AsyncWireGuard._wg_build_allowedips(None, list(peer.allowed_ips))
    attrs.append(["WGPEER_A_ALLOWEDIPS", allowed])
    return attrs


def _message(interface: str, device: list[Any], peers: Sequence[DevicePeer]) -> bytes:
    """A dump message as the kernel sends it (encoded by pyroute2)."""
    msg = wgmsg()
    msg["cmd"] = 0
    msg["version"] = 1
    msg["attrs"] = [["WGDEVICE_A_IFNAME", interface], *device]
    if peers:
        msg["attrs"].append(["WGDEVICE_A_PEERS", [{"attrs": _peer_attrs(p)} for p in peers]])
    msg.encode()
    return bytes(msg.data)


class FakeKernel:
    """Links by name and kind, and WireGuard devices answering a dump as the kernel does."""

    def __init__(self) -> None:
        self.links: dict[str, str] = {}
        self.devices: dict[str, tuple[str, Sequence[DevicePeer]]] = {}
        self.refuse: int | None = None
        """An errno every dump fails with (EPERM for a reader without CAP_NET_ADMIN)."""
        self.opened: list[str | None] = []

    def add(self, interface: str, peers: Sequence[DevicePeer], private_key: str = PRIVATE_KEY):
        self.links[interface] = "wireguard"
        self.devices[interface] = (private_key, peers)

    def link_kind(self, netns: str | None, name: str) -> str | None:
        return self.links.get(name)

    def open(self, netns: str | None) -> FakeKernel:
        self.opened.append(netns)
        return self

    def dump(self, interface: str) -> list[bytes]:
        if self.refuse is not None:
            raise NetlinkError(self.refuse, errno.errorcode[self.refuse])
        if interface not in self.devices:
            raise NetlinkError(errno.ENODEV, "No such device")
        private_key, peers = self.devices[interface]
        device = [["WGDEVICE_A_PRIVATE_KEY", private_key], ["WGDEVICE_A_LISTEN_PORT", PORT]]
        # The first message holds the device and the first peer; the rest follow.
        return [_message(interface, device, peers[:1]), _message(interface, [], peers[1:])]

    def close(self) -> None:
        pass


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    """The fake kernel behind the reader's defaults (the link lookup and the WireGuard socket)."""
    fake = FakeKernel()
    monkeypatch.setattr("vnetd.dataplane.rtnetlink.link_reads.link_kind", fake.link_kind)
    monkeypatch.setattr("vnetd.dataplane.kernel.device.open_wireguard", fake.open)
    return fake


@asynccontextmanager
async def wireguard_go(path: Path, answer: bytes) -> AsyncIterator[None]:
    """A UAPI socket at ``path`` answering every ``get`` with ``answer``."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(4)
    listener = trio.SocketListener(sock)

    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            # The client's request is one 7-byte write: one read on a unix socket.
            assert await stream.receive_some(1024) == GET_REQUEST
            await stream.send_all(answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, [listener])
        yield
        nursery.cancel_scope.cancel()


# --- read_device -------------------------------------------------------------------------


async def test_both_readers_return_the_same_record_for_the_same_peers(tmp_path, kernel):
    kernel.add("vnet0", PEERS)
    with trio.fail_after(10):
        from_kernel = await read_device("vnet0", tmp_path)
        async with wireguard_go(tmp_path / "vnet0.sock", uapi_answer(PEERS)):
            from_uapi = await read_device("vnet0", tmp_path)
    assert kernel.opened == [None], "the kernel is read once: the socket answered the second time"
    expected = LocalDevice(DEVICE_KEY, PORT, {peer.public_key: peer for peer in PEERS})
    assert from_kernel == expected
    assert from_uapi == expected


async def test_a_stale_socket_falls_back_to_the_kernel(tmp_path, kernel):
    kernel.add("vnet0", PEERS[:1])
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(tmp_path / "vnet0.sock"))
    sock.close()  # the file stays; nothing listens: connection refused
    with trio.fail_after(10):
        device = await read_device("vnet0", tmp_path)
    assert set(device.peers) == {key(1)}


@pytest.mark.parametrize(
    "links",
    [
        pytest.param({}, id="no-link"),
        pytest.param({"vnet0": "tun"}, id="link-of-another-kind"),
        pytest.param({"vnet0": "wireguard"}, id="link-gone-before-the-read"),
    ],
)
async def test_no_device_anywhere_names_the_socket(tmp_path, kernel, links):
    kernel.links.update(links)
    with trio.fail_after(10), pytest.raises(DataplaneError) as caught:
        await read_device("vnet0", tmp_path)
    assert str(caught.value) == (
        f"no WireGuard device at {tmp_path}/vnet0.sock (is vnetd up running, and is "
        "--wireguard-dir the directory it shares?)"
    )


async def test_a_kernel_device_this_user_may_not_read_says_so(tmp_path, kernel):
    kernel.add("vnet0", PEERS)
    kernel.refuse = errno.EPERM
    with trio.fail_after(10), pytest.raises(DataplaneError, match="needs CAP_NET_ADMIN"):
        await read_device("vnet0", tmp_path)


async def test_the_kernel_reader_keeps_no_private_key(tmp_path, kernel):
    kernel.add("vnet0", PEERS)
    with trio.fail_after(10):
        device = await read_device("vnet0", tmp_path)
    assert device.public_key == DEVICE_KEY
    assert PRIVATE_KEY not in repr(device)


# --- the commands on the kernel's code path ----------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(SPEC_TEXT)
    return path


async def registered(spec: MeshSpec, ranks: Iterable[int]) -> MemoryRegistry:
    registry = MemoryRegistry()
    for rank in ranks:
        public_key = DEVICE_KEY if rank == 0 else key(rank)
        member = Member(rank, public_key, f"198.18.1.{rank}:51820", f"pod{rank}", NOW - 90, "0.1")
        await create_leased(registry, member_key(spec, rank), encode_member(member))
    return registry


def opener(registry: MemoryRegistry):
    @asynccontextmanager
    async def open_registry(_: object) -> AsyncIterator[Registry]:
        yield registry

    return open_registry


async def test_status_shows_a_kernel_device(tmp_path, config, kernel):
    kernel.add("vnet0", PEERS)
    out = io.StringIO()
    for as_json in (False, True):
        plan = StatusPlan(load_spec(config), json=as_json, wireguard_dir=tmp_path)
        registry = await registered(plan.spec, (0, 1, 2))
        with trio.fail_after(30):
            await show_status(
                plan, open_registry=opener(registry), console=plain_console(out), clock=lambda: NOW
            )
    assert kernel.opened == [None, None], "no socket in --wireguard-dir: the kernel was read"
    table, document = out.getvalue().split("\n{", 1)
    lines = table.splitlines()
    assert lines[2].endswith("this device         -         -")
    assert lines[3].endswith("10 s ago     2.00 KiB  4.00 KiB")
    assert lines[4].endswith("never             0 B       0 B")
    assert lines[-1] == "device: 1/2 registered peers shook hands, never: 2"
    doc = json.loads("{" + document)
    assert doc["device"] == {"public_key": DEVICE_KEY, "peers": 3}
    assert doc["notes"] == []


async def test_wait_reachable_reads_a_kernel_device(tmp_path, config, kernel, capsys):
    kernel.add("vnet0", PEERS)
    options = WaitOptions(
        load_spec(config), ranks="0,1", reachable=True, rank="0", wireguard_dir=tmp_path
    )
    plan = plan_wait(options, {}, "unit-0")
    with trio.fail_after(30):
        assert await run_wait(plan, open_registry=opener(await registered(plan.spec, (0, 1)))) == 0
    assert capsys.readouterr().out.startswith(
        "vnetd wait: 2/2 ranks registered; 1/1 peers reachable after "
    )
    assert kernel.opened, "no socket in --wireguard-dir: the kernel was read"


async def test_wait_reachable_on_a_kernel_device_waits_for_the_handshake(
    tmp_path, config, kernel, capsys
):
    kernel.add("vnet0", PEERS)
    options = WaitOptions(
        load_spec(config), ranks="0,2", reachable=True, rank="0", wireguard_dir=tmp_path, timeout=1
    )
    plan = plan_wait(options, {}, "unit-0")
    with trio.fail_after(30):
        assert await run_wait(plan, open_registry=opener(await registered(plan.spec, (0, 2)))) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "vnetd: timed out after 1 s: 2/2 ranks registered; 0/1 peers reachable, no handshake: 2"
    )
