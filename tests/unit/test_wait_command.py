"""``vnetd wait``: the pure gate, the wait loop on a MemoryRegistry in virtual time, the CLI."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from shared import create_leased, key

from vnetd.cli import main
from vnetd.commands.wait.command import WaitOptions, WaitPlan, plan_wait, run_wait, uapi_peers
from vnetd.config import resolve_spec
from vnetd.control.membership import encode_member, member_key
from vnetd.errors import DataplaneError, IdentityError, SpecError
from vnetd.model import DevicePeer, Member
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec
from vnetd.wait.gate import Gate, carriers, evaluate, handshake_keys


async def register(registry: MemoryRegistry, spec: MeshSpec, rank: int) -> None:
    member = Member(rank, key(rank), f"198.18.1.{rank}:51820", f"pod{rank}")
    await create_leased(registry, member_key(spec, rank), encode_member(member))


async def leave(registry: MemoryRegistry, spec: MeshSpec, rank: int) -> None:
    await registry.delete(member_key(spec, rank))


def opener(registry: MemoryRegistry):
    @asynccontextmanager
    async def open_registry(spec: MeshSpec) -> AsyncIterator[Registry]:
        yield registry

    return open_registry


def printed(err: str) -> list[str]:
    """The lines ``vnetd wait`` printed (a test elsewhere may leave a log handler on stderr)."""
    return [line for line in err.splitlines() if line.startswith(("vnetd wait: ", "vnetd: "))]


class Background:
    """``run_wait`` in a task; ``code`` is None while it still waits."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.done = trio.Event()

    async def run(self, plan: WaitPlan, registry: MemoryRegistry, **kwargs) -> None:
        self.code = await run_wait(plan, open_registry=opener(registry), **kwargs)
        self.done.set()


# --- the pure gate ----------------------------------------------------------------------

REGISTERED = {0: key(0), 1: key(1), 3: key(3)}


@pytest.mark.parametrize(
    ("gate", "handshakes", "ready", "summary"),
    [
        pytest.param(
            Gate(4, (0, 1, 2, 3)),
            set(),
            False,
            "3/4 ranks registered, missing: 2",
            id="ranks-missing",
        ),
        pytest.param(Gate(4, (0, 1, 3)), set(), True, "3/3 ranks registered", id="ranks-ready"),
        pytest.param(
            Gate(4, (0, 1, 3), self_rank=0, reachable=True),
            {key(1)},
            False,
            "3/3 ranks registered; 1/2 peers reachable, no handshake: 3",
            id="reachable-missing-handshake",
        ),
        pytest.param(
            Gate(4, (0, 1, 3), self_rank=0, reachable=True),
            {key(1), key(3)},
            True,
            "3/3 ranks registered; 2/2 peers reachable",
            id="reachable-ready",
        ),
        pytest.param(
            Gate(4, (0, 2), self_rank=0, reachable=True),
            {key(2)},
            False,
            "1/2 ranks registered, missing: 2; 0/1 peers reachable",
            id="handshake-without-record-does-not-count",
        ),
        pytest.param(
            Gate(4, min_peers=2, self_rank=0),
            set(),
            True,
            "2 peers registered (need 2)",
            id="peers-ready",
        ),
        pytest.param(
            Gate(4, min_peers=3, self_rank=0),
            set(),
            False,
            "2 peers registered (need 3), unregistered: 2",
            id="peers-exclude-self",
        ),
        pytest.param(
            Gate(4, min_peers=3),
            set(),
            True,
            "3 ranks registered (need 3)",
            id="no-self-counts-any",
        ),
        pytest.param(
            Gate(4, min_peers=2, self_rank=1, reachable=True),
            {key(0)},
            False,
            "1 peers reachable (need 2), 2 registered, no handshake: 3, unregistered: 2",
            id="peers-reachable",
        ),
        pytest.param(
            Gate(4, min_peers=0, self_rank=2),
            set(),
            True,
            "3 peers registered (need 0)",
            id="zero-peers",
        ),
    ],
)
def test_evaluate(gate, handshakes, ready, summary):
    status = evaluate(gate, REGISTERED, handshakes)
    assert (status.ready, status.summary) == (ready, summary)


def gatewayed(spec: MeshSpec, handshake: float = 1.0) -> dict[str, DevicePeer]:
    """Rank 0's device in a burst: rank 1 of its own site direct, ranks 2 and 3 of the
    other site behind rank 2, their gateway, whose peer holds both addresses (invariant 2)."""
    gateway = (*spec.allowed_ips(2), *spec.allowed_ips(3))
    return {
        key(1): DevicePeer(key(1), spec.allowed_ips(1), None, 1.0),
        key(2): DevicePeer(key(2), gateway, None, handshake),
    }


@pytest.mark.parametrize(
    ("peers", "registered", "expected"),
    [
        pytest.param(
            "gatewayed",
            {1: key(1), 2: key(2), 3: key(3)},
            {1: key(1), 2: key(2), 3: key(2)},
            id="behind-a-gateway-its-key",
        ),
        pytest.param("none", {1: key(1)}, {1: key(1)}, id="no-peer-keeps-its-own-key"),
        pytest.param(
            "stale",
            {1: key(1)},
            {1: key(1)},
            id="a-peer-of-no-registered-key-does-not-stand-in",
        ),
    ],
)
def test_carriers(config, peers, registered, expected):
    spec = load_spec(config)
    device = {
        "gatewayed": gatewayed(spec),
        "none": {},
        "stale": {key(9): DevicePeer(key(9), spec.allowed_ips(1), None, 1.0)},
    }[peers]
    assert carriers(spec, registered, device) == expected


def test_gate_never_opens_before_the_first_list():
    assert evaluate(Gate(4, min_peers=0), {}, listed=False).ready is False


# --- options ----------------------------------------------------------------------------


def test_plan_resolves_this_rank_only_when_it_can(config):
    assert (
        plan_wait(WaitOptions(load_spec(config), min_peers=1), {}, "login1").gate.self_rank is None
    )
    assert plan_wait(WaitOptions(load_spec(config), min_peers=1), {}, "unit-2").gate.self_rank == 2
    assert (
        plan_wait(
            WaitOptions(load_spec(config), min_peers=1), {"JOB_COMPLETION_INDEX": "3"}, "x"
        ).gate.self_rank
        == 3
    )
    with pytest.raises(IdentityError, match="VNETD_RANK: 'x' is not a rank"):
        plan_wait(WaitOptions(load_spec(config), min_peers=1), {"VNETD_RANK": "x"}, "unit-2")
    with pytest.raises(IdentityError, match="no rank: give --rank"):
        plan_wait(WaitOptions(load_spec(config), ranks="all", reachable=True), {}, "login1")


def test_plan_device_socket_and_etcd_override(config):
    plan = plan_wait(
        WaitOptions(
            resolve_spec(config, {}, etcd=["http://127.0.0.1:2"]),
            ranks="all",
            reachable=True,
            rank="1",
            wireguard_dir=Path("/shared/wg"),
        ),
        {},
        "x",
    )
    assert plan.device_socket == Path("/shared/wg/vnet0.sock")
    assert plan.spec.registry.endpoints == ("http://127.0.0.1:2",)
    assert plan.gate == Gate(4, (0, 1, 2, 3), None, 1, True)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        pytest.param(
            {"min_peers": 4},
            r"--min-peers: 4 is out of range; mesh 'unit' has 4 ranks, so give 0\.\.3",
            id="peers-too-many",
        ),
        pytest.param({"min_peers": -1}, r"--min-peers: -1 is out of range", id="peers-negative"),
        pytest.param(
            {"ranks": "all", "timeout": 0.0},
            r"--timeout: 0 is not a positive number",
            id="timeout-zero",
        ),
        pytest.param(
            {"ranks": "all", "timeout": float("nan")}, r"--timeout: nan is not", id="timeout-nan"
        ),
        pytest.param({"ranks": "0-4"}, r"--ranks: rank 4 in '0-4' is out of range", id="ranks"),
    ],
)
def test_plan_refuses(config, opts, message):
    with pytest.raises(SpecError, match=message):
        plan_wait(WaitOptions(load_spec(config), **opts), {}, "x")


# --- the wait loop, in virtual time -----------------------------------------------------


async def test_ranks_arriving_one_by_one(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="all", timeout=30), {}, "x")
    registry = MemoryRegistry()
    waiter = Background()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter.run, plan, registry)
            for rank in (2, 0, 3, 1):
                await trio.sleep(1.5)
                assert waiter.code is None
                await register(registry, plan.spec, rank)
            await waiter.done.wait()
    assert waiter.code == 0
    out, err = capsys.readouterr()
    assert out == "vnetd wait: 4/4 ranks registered after 6.0 s\n"
    assert printed(err) == [
        "vnetd wait: 0/4 ranks registered, missing: 0-3 (0 s of 30 s)",
        "vnetd wait: 3/4 ranks registered, missing: 1 (5 s of 30 s)",
    ]


async def test_already_complete_prints_only_the_result(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="1,3"), {}, "x")
    registry = MemoryRegistry()
    for rank in (1, 3):
        await register(registry, plan.spec, rank)
    with trio.fail_after(5):
        assert await run_wait(plan, open_registry=opener(registry)) == 0
    out, err = capsys.readouterr()
    assert (out, printed(err)) == ("vnetd wait: 2/2 ranks registered after 0.0 s\n", [])


async def test_a_rank_that_leaves_is_waited_for_again(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="0-2", timeout=60), {}, "x")
    registry = MemoryRegistry()
    waiter = Background()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter.run, plan, registry)
            await register(registry, plan.spec, 0)
            await register(registry, plan.spec, 1)
            await trio.sleep(1)
            await leave(registry, plan.spec, 1)
            await trio.sleep(1)
            await register(registry, plan.spec, 2)
            await trio.sleep(10)
            assert waiter.code is None, "rank 1 left; the set is not complete"
            await register(registry, plan.spec, 1)
            await waiter.done.wait()
    assert waiter.code == 0
    out, err = capsys.readouterr()
    assert out == "vnetd wait: 3/3 ranks registered after 12.0 s\n"
    assert printed(err) == [
        "vnetd wait: 2/3 ranks registered, missing: 2 (0 s of 60 s)",
        "vnetd wait: 2/3 ranks registered, missing: 1 (5 s of 60 s)",
        "vnetd wait: 2/3 ranks registered, missing: 1 (10 s of 60 s)",
    ]


async def test_timeout_exits_1_naming_the_missing_ranks(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="all", timeout=12), {}, "x")
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0)
    await register(registry, plan.spec, 2)
    with trio.fail_after(60):
        start = trio.current_time()
        assert await run_wait(plan, open_registry=opener(registry)) == 1
        assert trio.current_time() - start == pytest.approx(12)
    out, err = capsys.readouterr()
    assert out == ""
    lines = printed(err)
    assert lines[-1] == "vnetd: timed out after 12 s: 2/4 ranks registered, missing: 1, 3"
    assert [line.rsplit("(", 1)[1] for line in lines[:-1]] == [
        "0 s of 12 s)",
        "5 s of 12 s)",
        "10 s of 12 s)",
    ]


async def test_min_peers_does_not_count_this_rank(config, autojump_clock, capsys):
    plan = plan_wait(
        WaitOptions(load_spec(config), min_peers=2, timeout=30), {"VNETD_RANK": "0"}, "x"
    )
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0)
    await register(registry, plan.spec, 3)
    waiter = Background()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter.run, plan, registry)
            await trio.sleep(2)
            assert waiter.code is None
            await register(registry, plan.spec, 1)
            await waiter.done.wait()
    assert waiter.code == 0
    out, err = capsys.readouterr()
    assert out == "vnetd wait: 2 peers registered (need 2) after 2.0 s\n"
    assert printed(err) == [
        "vnetd wait: 1 peers registered (need 2), unregistered: 1, 2 (0 s of 30 s)"
    ]


async def test_min_peers_without_a_rank_counts_any_ranks(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), min_peers=2), {}, "login1")
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0)
    await register(registry, plan.spec, 3)
    with trio.fail_after(5):
        assert await run_wait(plan, open_registry=opener(registry)) == 0
    assert capsys.readouterr().out == "vnetd wait: 2 ranks registered (need 2) after 0.0 s\n"


def shaken(spec: MeshSpec, *ranks: int) -> dict[str, DevicePeer]:
    """A direct peer for each of ``ranks``, holding its address, with a handshake."""
    return {key(r): DevicePeer(key(r), spec.allowed_ips(r), None, 1.0) for r in ranks}


class FakeDevice:
    """A device reader: its peers, or no device at all."""

    def __init__(self) -> None:
        self.peers: dict[str, DevicePeer] = {}
        self.present = False
        self.reads = 0

    async def __call__(self) -> dict[str, DevicePeer]:
        self.reads += 1
        if not self.present:
            raise DataplaneError("no WireGuard device at /shared/vnet0.sock")
        return dict(self.peers)


async def test_reachable_waits_for_handshakes(config, autojump_clock, capsys):
    plan = plan_wait(
        WaitOptions(load_spec(config), ranks="0-2", reachable=True, rank="0", timeout=60), {}, "x"
    )
    registry = MemoryRegistry()
    device = FakeDevice()
    waiter = Background()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(waiter.run, plan, registry, read_peers=device))
            for rank in (0, 1, 2):
                await register(registry, plan.spec, rank)
            await trio.sleep(6)
            device.present = True
            await trio.sleep(5)
            assert waiter.code is None, "registered, but no handshake yet"
            device.peers = shaken(plan.spec, 1, 3)
            await trio.sleep(5.2)  # off the 0.5 s polling grid, so the order of wake-ups is moot
            assert waiter.code is None, "rank 2 has no handshake; rank 3 is not asked for"
            device.peers |= shaken(plan.spec, 2)
            await waiter.done.wait()
    assert waiter.code == 0
    assert 30 <= device.reads <= 36, "the device is read every 0.5 s"
    out, err = capsys.readouterr()
    assert out == "vnetd wait: 3/3 ranks registered; 2/2 peers reachable after 16.5 s\n"
    assert printed(err)[:4] == [
        "vnetd wait: 3/3 ranks registered; 0/2 peers reachable, no handshake: 1, 2; "
        "device not readable: no WireGuard device at /shared/vnet0.sock (0 s of 60 s)",
        "vnetd wait: 3/3 ranks registered; 0/2 peers reachable, no handshake: 1, 2; "
        "device not readable: no WireGuard device at /shared/vnet0.sock (5 s of 60 s)",
        "vnetd wait: 3/3 ranks registered; 0/2 peers reachable, no handshake: 1, 2 (10 s of 60 s)",
        "vnetd wait: 3/3 ranks registered; 1/2 peers reachable, no handshake: 2 (15 s of 60 s)",
    ]


async def test_reachable_timeout_names_ranks_without_handshake(config, autojump_clock, capsys):
    plan = plan_wait(
        WaitOptions(load_spec(config), ranks="all", reachable=True, rank="1", timeout=3), {}, "x"
    )
    registry = MemoryRegistry()
    for rank in (0, 1, 2):
        await register(registry, plan.spec, rank)
    device = FakeDevice()
    device.present = True
    device.peers = shaken(plan.spec, 2)
    with trio.fail_after(10):
        assert await run_wait(plan, open_registry=opener(registry), read_peers=device) == 1
    assert printed(capsys.readouterr().err)[-1] == (
        "vnetd: timed out after 3 s: 3/4 ranks registered, missing: 3; "
        "1/3 peers reachable, no handshake: 0"
    )


async def test_min_peers_reachable(config, autojump_clock, capsys):
    plan = plan_wait(
        WaitOptions(load_spec(config), min_peers=1, reachable=True, rank="2", timeout=30), {}, "x"
    )
    registry = MemoryRegistry()
    for rank in (0, 2):
        await register(registry, plan.spec, rank)
    device = FakeDevice()
    device.present = True
    device.peers = shaken(plan.spec, 2)  # this rank's own key never counts
    waiter = Background()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(waiter.run, plan, registry, read_peers=device))
            await trio.sleep(3.2)  # off the 0.5 s polling grid
            assert waiter.code is None
            device.peers |= shaken(plan.spec, 0)
            await waiter.done.wait()
    assert waiter.code == 0
    assert capsys.readouterr().out == (
        "vnetd wait: 1 peers reachable (need 1), 1 registered after 3.5 s\n"
    )


async def test_a_rank_behind_a_gateway_is_reached_by_the_gateways_handshake(
    config, autojump_clock, capsys
):
    """Ranks 2 and 3 have no peer of their own on rank 0's device: the gateway's peer holds
    their addresses, so its handshake reaches them, and without one both are named."""
    plan = plan_wait(
        WaitOptions(load_spec(config), ranks="all", reachable=True, rank="0", timeout=3), {}, "x"
    )
    registry = MemoryRegistry()
    for rank in range(4):
        await register(registry, plan.spec, rank)
    device = FakeDevice()
    device.present = True
    device.peers = gatewayed(plan.spec)
    with trio.fail_after(10):
        assert await run_wait(plan, open_registry=opener(registry), read_peers=device) == 0
    assert capsys.readouterr().out == (
        "vnetd wait: 4/4 ranks registered; 3/3 peers reachable after 0.0 s\n"
    )
    device.peers = gatewayed(plan.spec, handshake=0.0)
    with trio.fail_after(10):
        assert await run_wait(plan, open_registry=opener(registry), read_peers=device) == 1
    assert printed(capsys.readouterr().err)[-1] == (
        "vnetd: timed out after 3 s: 4/4 ranks registered; 1/3 peers reachable, no handshake: 2, 3"
    )


async def test_registry_outage_then_back(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="0,1", timeout=120), {}, "x")
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0)
    registry.fail(True)
    waiter = Background()
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter.run, plan, registry)
            await trio.sleep(30)
            assert waiter.code is None
            registry.fail(False)
            await trio.sleep(4)  # the watcher's backoff is at most 3 s
            assert waiter.code is None
            await register(registry, plan.spec, 1)
            await waiter.done.wait()
    assert waiter.code == 0
    out, err = capsys.readouterr()
    assert out == "vnetd wait: 2/2 ranks registered after 34.0 s\n"
    assert printed(err) == [
        f"vnetd wait: 0/2 ranks registered, missing: 0, 1; registry unreachable ({t} s of 120 s)"
        for t in range(0, 31, 5)
    ]


async def test_registry_outage_until_timeout(config, autojump_clock, capsys):
    plan = plan_wait(WaitOptions(load_spec(config), ranks="0", timeout=8), {}, "x")
    registry = MemoryRegistry()
    registry.fail(True)
    with trio.fail_after(30):
        assert await run_wait(plan, open_registry=opener(registry)) == 1
    assert printed(capsys.readouterr().err)[-1] == (
        "vnetd: timed out after 8 s: 0/1 ranks registered, missing: 0; registry unreachable"
    )


async def test_uapi_reader_reports_the_peers_with_their_addresses_and_handshakes(tmp_path):
    path = tmp_path / "vnet0.sock"
    hex_key = {rank: base64.b64decode(key(rank)).hex() for rank in (1, 2)}
    answer = (
        f"private_key={'0' * 64}\nlisten_port=51820\n"
        f"public_key={hex_key[1]}\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
        "allowed_ip=10.250.0.2/32\n"
        f"public_key={hex_key[2]}\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\n"
        "allowed_ip=10.250.0.4/32\nallowed_ip=10.250.0.3/32\n"
        "errno=0\n\n"
    ).encode()
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(1)
    listener = trio.SocketListener(sock)

    async def serve_once() -> None:
        stream = await listener.accept()
        async with stream:
            request = b""
            while not request.endswith(b"\n\n"):
                request += await stream.receive_some(1024)
            assert request == b"get=1\n\n"
            await stream.send_all(answer)

    read = uapi_peers(path)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_once)
            peers = await read()
    assert {k: p.allowed_ips for k, p in peers.items()} == {
        key(1): ("10.250.0.2/32",),
        key(2): ("10.250.0.3/32", "10.250.0.4/32"),
    }
    assert handshake_keys(peers) == {key(2)}
    await listener.aclose()


async def test_uapi_reader_says_where_the_device_is_missing(tmp_path):
    read = uapi_peers(tmp_path / "vnet0.sock")
    with (
        trio.fail_after(10),
        pytest.raises(
            DataplaneError, match=r"no WireGuard device at .*vnet0\.sock .*--wireguard-dir"
        ),
    ):
        await read()


# --- through the CLI --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--ranks", "0-9"],
            "vnetd: error: --ranks: rank 9 in '0-9' is out of range; the ranks of this mesh are 0..3\n",
            id="ranks-out-of-range",
        ),
        pytest.param(
            ["--ranks", "3-1"],
            "vnetd: error: --ranks: '3-1' is a reversed range; write 1-3 (the ranks of this mesh are 0..3)\n",
            id="ranks-reversed",
        ),
        pytest.param(
            ["--ranks", "1,,2"],
            "vnetd: error: --ranks: '1,,2' has an empty item; use all, 5, 0-7 or 0,3,5-9 (the ranks of this mesh are 0..3)\n",
            id="ranks-empty-item",
        ),
        pytest.param(
            ["--ranks", ""],
            "vnetd: error: --ranks: empty; use all, 5, 0-7 or 0,3,5-9 (the ranks of this mesh are 0..3)\n",
            id="ranks-empty",
        ),
        pytest.param(
            ["--min-peers", "4"],
            "vnetd: error: --min-peers: 4 is out of range; mesh 'unit' has 4 ranks, so give 0..3\n",
            id="min-peers-too-many",
        ),
        pytest.param(
            ["--min-peers", "-2"],
            "vnetd: error: --min-peers: -2 is out of range; mesh 'unit' has 4 ranks, so give 0..3\n",
            id="min-peers-negative",
        ),
        pytest.param(
            ["--ranks", "all", "--timeout", "-1"],
            "vnetd: error: --timeout: -1 is not a positive number of seconds\n",
            id="timeout-negative",
        ),
    ],
)
def test_cli_bad_input_exits_2(config, capsys, args, message):
    assert main(["wait", "--config", str(config), *args]) == 2
    assert capsys.readouterr() == ("", message)


def test_cli_missing_config_exits_2(tmp_path, capsys):
    assert main(["wait", "--config", str(tmp_path / "nope.toml"), "--ranks", "all"]) == 2
    assert capsys.readouterr().err == f"vnetd: error: {tmp_path / 'nope.toml'}: no such file\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--ranks", "all", "--min-peers", "1"],
            "argument --min-peers: not allowed with argument --ranks",
            id="both",
        ),
        pytest.param([], "one of the arguments --ranks --min-peers is required", id="neither"),
        pytest.param(
            ["--min-peers", "two"],
            "argument --min-peers: invalid int value: 'two'",
            id="min-peers-not-int",
        ),
    ],
)
def test_cli_usage_errors(config, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["wait", "--config", str(config), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


async def test_a_member_held_after_a_registry_reset_does_not_count():
    from vnetd.commands.wait.run import _Waiter
    from vnetd.control.retry import RegistryHealth
    from vnetd.control.watcher import MemberView
    from vnetd.registry.base import KeyValue
    from vnetd.spec import parse_spec

    spec = parse_spec({"mesh": {"name": "m", "size": 2, "network": "10.0.0.0/24"}})
    key = base64.b64encode(bytes(range(32))).decode()
    member = Member(rank=1, public_key=key, endpoint="198.18.1.1:51820", instance="pod1")
    view = MemberView()
    view.replace(spec, [KeyValue(member_key(spec, 1), encode_member(member), 5, 5, 1)], 100)
    waiter = _Waiter(Gate(size=2, ranks=(1,)), spec, 60, view, RegistryHealth(), None)
    assert waiter.status().ready
    view.replace(spec, [], 3, hold_until=trio.current_time() + 20)  # revision went back
    assert 1 in view.held and 1 in view.members
    assert not waiter.status().ready
