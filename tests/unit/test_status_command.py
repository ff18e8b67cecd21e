"""``vnetd status``: the command on a MemoryRegistry and fake devices, in virtual time; the CLI."""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from rich.console import Console
from shared import create_leased, key

from vnetd.cli import main
from vnetd.commands.status.plan import StatusPlan
from vnetd.commands.status.show import DEVICE_TIMEOUT, show_status
from vnetd.control.membership import encode_member, member_key, read_members
from vnetd.dataplane.device_reader import LocalDevice, read_local_device
from vnetd.errors import DataplaneError, RegistryUnavailable
from vnetd.keys import public_key_of
from vnetd.model import DevicePeer, Member
from vnetd.registry.base import Registry
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import MeshSpec, load_spec
from vnetd.status.table import plain_console

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
PRIVATE_KEY = base64.b64encode(bytes(range(1, 33))).decode()
DEVICE_KEY = public_key_of(PRIVATE_KEY)


def wall_clock() -> float:
    """Wall-clock seconds that follow trio's (virtual) clock."""
    return NOW + trio.current_time()


async def register(
    registry: MemoryRegistry, spec: MeshSpec, rank: int, public_key: str | None = None
) -> Member:
    member = Member(
        rank, public_key or key(rank), f"198.18.1.{rank}:51820", f"pod{rank}", NOW - 90, "0.1.0"
    )
    await create_leased(registry, member_key(spec, rank), encode_member(member))
    return member


def opener(registry: MemoryRegistry):
    @asynccontextmanager
    async def open_registry(endpoints: Sequence[str]) -> AsyncIterator[Registry]:
        yield registry

    return open_registry


def no_device(path: Path):
    async def read(socket: Path) -> LocalDevice:
        assert socket == path
        raise DataplaneError(f"no WireGuard device at {socket} (is vnetd up running, ...)")

    return read


def fake_device(*peers: DevicePeer, public_key: str | None = DEVICE_KEY):
    async def read(socket: Path) -> LocalDevice:
        return LocalDevice(public_key, 51820, {peer.public_key: peer for peer in peers})

    return read


class Screen:
    """A console writing to memory: plain (a pipe) or a colour terminal."""

    def __init__(self, *, terminal: bool = False) -> None:
        self.file = io.StringIO()
        if terminal:
            self.console = Console(
                file=self.file, force_terminal=True, color_system="standard", width=200
            )
        else:
            self.console = plain_console(self.file)

    @property
    def text(self) -> str:
        return self.file.getvalue()


async def status(plan: StatusPlan, registry: MemoryRegistry, screen: Screen, **kwargs) -> int:
    kwargs.setdefault("read_device", no_device(plan.device_socket))
    kwargs.setdefault("clock", lambda: NOW)
    with trio.fail_after(60):
        return await show_status(
            plan, open_registry=opener(registry), console=screen.console, **kwargs
        )


# --- one view ----------------------------------------------------------------------------


async def test_table_shows_missing_ranks_and_says_why_there_are_no_device_columns(config):
    plan = StatusPlan(load_spec(config), wireguard_dir=Path("/shared/wg"))
    registry = MemoryRegistry()
    for rank in (0, 2):
        await register(registry, plan.spec, rank)
    screen = Screen()
    assert await status(plan, registry, screen) == 0
    assert screen.text == (
        "mesh unit: 4 ranks in 10.250.0.0/16, at 2023-11-14T22:13:20Z\n"
        "rank  address     hostname  state       pod   endpoint          since (UTC)\n"
        "   0  10.250.0.1  unit-0    registered  pod0  198.18.1.0:51820  22:11:50 (1 min 30 s)\n"
        "   1  10.250.0.2  unit-1    missing     -     -                 -\n"
        "   2  10.250.0.3  unit-2    registered  pod2  198.18.1.2:51820  22:11:50 (1 min 30 s)\n"
        "   3  10.250.0.4  unit-3    missing     -     -                 -\n"
        "2/4 registered, 2 missing: 1, 3\n"
        "no device columns: no WireGuard device at /shared/wg/vnet0.sock "
        "(is vnetd up running, ...)\n"
    )


async def test_table_with_device_columns(config):
    plan = StatusPlan(load_spec(config))
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0, DEVICE_KEY)
    for rank in (1, 2):
        await register(registry, plan.spec, rank)
    device = fake_device(
        DevicePeer(key(1), ("10.250.0.2/32",), "198.18.1.1:51820", NOW - 12, 1260, 47_815_065),
        DevicePeer(key(2), ("10.250.0.3/32",), "198.18.1.2:51820"),
    )
    screen = Screen()
    assert await status(plan, registry, screen, read_device=device) == 0
    lines = screen.text.splitlines()
    assert lines[1].split() == [
        "rank", "address", "hostname", "state", "pod", "endpoint", "since", "(UTC)",
        "handshake", "rx", "tx",
    ]  # fmt: skip
    assert lines[2].endswith("22:11:50 (1 min 30 s)  this device         -         -")
    assert lines[3].endswith("22:11:50 (1 min 30 s)  12 s ago     1.23 KiB  45.6 MiB")
    assert lines[4].endswith("22:11:50 (1 min 30 s)  never             0 B       0 B")
    assert lines[5].split() == ["3", "10.250.0.4", "unit-3", "missing", *["-"] * 6]
    assert lines[6:] == [
        "3/4 registered, 1 missing: 3",
        "device: 1/2 registered peers shook hands, never: 2",
    ]


async def test_a_device_reader_slower_than_one_request_still_gives_the_columns(
    config, autojump_clock
):
    """The first read of a kernel device imports pyroute2 before its bounded request
    (3 s in the kernel guest): status must wait for the reader, not cut it off."""
    plan = StatusPlan(load_spec(config))
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0, DEVICE_KEY)
    answer = fake_device()

    async def slow_first_read(socket: Path) -> LocalDevice:
        await trio.sleep(DEVICE_TIMEOUT + 2)
        return await answer(socket)

    screen = Screen()
    assert await status(plan, registry, screen, read_device=slow_first_read) == 0
    assert screen.text.splitlines()[1].split()[-3:] == ["handshake", "rx", "tx"], screen.text


async def test_plain_output_has_no_escape_codes_and_a_terminal_gets_colours(config):
    plan = StatusPlan(load_spec(config))
    registry = MemoryRegistry()
    await register(registry, plan.spec, 0)
    plain, terminal = Screen(), Screen(terminal=True)
    await status(plan, registry, plain)
    await status(plan, registry, terminal)
    assert "\x1b" not in plain.text
    assert all(line == line.rstrip() for line in plain.text.splitlines())
    missing = [line for line in terminal.text.splitlines() if "missing" in line]
    assert len(missing) == 4, terminal.text  # three rows and the summary
    assert all("\x1b[" in line for line in missing)
    assert "\x1b[1;2;31mmissing" in missing[0], "a missing rank's state is bold red on dim"


async def test_json_matches_the_registry(config):
    plan = StatusPlan(load_spec(config), json=True)
    registry = MemoryRegistry()
    for rank in (3, 1):
        await register(registry, plan.spec, rank)
    await create_leased(registry, member_key(plan.spec, 2), b"not json")
    await registry.create(f"{plan.spec.registry.prefix}/other/members/0", b"{}")
    screen = Screen()
    assert await status(plan, registry, screen) == 0
    doc = json.loads(screen.text)
    members, bad = await read_members(registry, plan.spec)
    assert bad == 1, "the value that is not JSON; the other mesh's key is not listed"
    assert (doc["registered"], doc["missing"], doc["bad_entries"]) == (len(members), [0, 2], bad)
    for row in doc["ranks"]:
        record = members.get(row["rank"])
        if record is None:
            assert row["state"] == "missing"
            assert {k: v for k, v in row.items() if v is not None} == {
                "rank": row["rank"],
                "address": str(plan.spec.address(row["rank"])),
                "addresses": [str(plan.spec.address(row["rank"]))],
                "hostname": plan.spec.host(row["rank"]),
                "state": "missing",
            }
            continue
        assert row["state"] == "registered"
        assert (
            row["public_key"],
            row["endpoint"],
            row["instance"],
            row["started"],
            row["version"],
        ) == (record.public_key, record.endpoint, record.instance, record.started, record.version)
    assert doc["notes"] == [
        "skipped 1 registry entries of mesh unit that are not members",
        "no device columns: no WireGuard device at /var/run/wireguard/vnet0.sock "
        "(is vnetd up running, ...)",
    ]
    assert doc["device"] is None


async def test_a_registry_that_cannot_be_read_is_one_clear_error(config):
    plan = StatusPlan(load_spec(config))
    registry = MemoryRegistry()
    registry.fail()
    with pytest.raises(RegistryUnavailable) as caught:
        await status(plan, registry, Screen())
    message = str(caught.value)
    assert message.startswith("reading the members of mesh unit: ")
    assert message.endswith("; check that etcd runs at http://127.0.0.1:1, or pass --etcd URL")
    assert "\n" not in message


async def test_a_registry_that_does_not_answer_is_bounded(config, autojump_clock):
    class Silent:
        async def list_prefix(self, prefix: str):
            await trio.sleep_forever()

    @asynccontextmanager
    async def open_silent(endpoints):
        yield Silent()

    plan = StatusPlan(load_spec(config))
    start = trio.current_time()
    with trio.fail_after(60), pytest.raises(RegistryUnavailable, match="no answer within 10 s"):
        await show_status(plan, open_registry=open_silent, console=Screen().console)
    assert trio.current_time() - start == pytest.approx(10)


# --- the private key --------------------------------------------------------------------


async def serve_uapi(listener: trio.SocketListener, answer: bytes, count: int) -> None:
    for _ in range(count):
        stream = await listener.accept()
        async with stream:
            request = b""
            while not request.endswith(b"\n\n"):
                request += await stream.receive_some(1024)
            assert request == b"get=1\n\n"
            await stream.send_all(answer)


async def uapi_listener(path: Path) -> trio.SocketListener:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(4)
    return trio.SocketListener(sock)


def uapi_answer() -> bytes:
    """A wireguard-go ``get`` answer: the private key first, as the real one sends it."""
    private_hex = base64.b64decode(PRIVATE_KEY).hex()
    peer_hex = base64.b64decode(key(1)).hex()
    return (
        f"private_key={private_hex}\nlisten_port=51820\n"
        f"public_key={peer_hex}\nendpoint=198.18.1.1:51820\nallowed_ip=10.250.0.2/32\n"
        "last_handshake_time_sec=1699999990\nlast_handshake_time_nsec=0\n"
        "rx_bytes=2048\ntx_bytes=4096\npersistent_keepalive_interval=0\n"
        "errno=0\n\n"
    ).encode()


async def test_the_private_key_never_appears(tmp_path, config):
    listener = await uapi_listener(tmp_path / "vnet0.sock")
    registry = MemoryRegistry()
    spec = load_spec(config)
    await register(registry, spec, 0, DEVICE_KEY)
    await register(registry, spec, 1)
    outputs = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_uapi, listener, uapi_answer(), 3)
            device = await read_local_device(tmp_path / "vnet0.sock")
            for as_json in (False, True):
                plan = StatusPlan(load_spec(config), json=as_json, wireguard_dir=tmp_path)
                screen = Screen()
                await status(plan, registry, screen, read_device=read_local_device)
                outputs.append(screen.text)
    await listener.aclose()
    assert device.public_key == DEVICE_KEY
    assert device.peers[key(1)].rx_bytes == 2048
    secrets = (PRIVATE_KEY, base64.b64decode(PRIVATE_KEY).hex())
    for text in (*outputs, repr(device)):
        assert not any(secret in text for secret in secrets)
    table, document = outputs
    assert "this device" in table.splitlines()[2], "the device's own rank is recognised"
    assert "10 s ago     2.00 KiB  4.00 KiB" in table.splitlines()[3]
    assert json.loads(document)["device"] == {"public_key": DEVICE_KEY, "peers": 1}


async def test_the_device_reader_says_where_the_device_is_missing(tmp_path):
    with (
        trio.fail_after(10),
        pytest.raises(
            DataplaneError, match=r"no WireGuard device at .*vnet0\.sock .*--wireguard-dir"
        ),
    ):
        await read_local_device(tmp_path / "vnet0.sock")


# --- --watch ----------------------------------------------------------------------------


async def test_watch_redraws_as_ranks_arrive(config, autojump_clock):
    plan = StatusPlan(load_spec(config), watch=True, interval=2)
    registry = MemoryRegistry()
    screen = Screen()
    start = trio.current_time()

    async def arrive() -> None:
        await trio.sleep(1)
        await register(registry, plan.spec, 2)
        await trio.sleep(2)
        await register(registry, plan.spec, 0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(arrive)
        await status(plan, registry, screen, clock=wall_clock, iterations=3)
    assert trio.current_time() - start == pytest.approx(4)
    views = screen.text.split("\n\n")
    assert [view.splitlines()[0] for view in views] == [
        "mesh unit: 4 ranks in 10.250.0.0/16, at 2023-11-14T22:13:20Z",
        "mesh unit: 4 ranks in 10.250.0.0/16, at 2023-11-14T22:13:22Z",
        "mesh unit: 4 ranks in 10.250.0.0/16, at 2023-11-14T22:13:24Z",
    ]
    assert [view.splitlines()[6] for view in views] == [
        "0/4 registered, 4 missing: 0-3",
        "1/4 registered, 3 missing: 0, 1, 3",
        "2/4 registered, 2 missing: 1, 3",
    ]


async def test_watch_on_a_terminal_redraws_in_place(config, autojump_clock):
    plan = StatusPlan(load_spec(config), watch=True, interval=2)
    registry = MemoryRegistry()
    screen = Screen(terminal=True)

    async def arrive() -> None:
        await trio.sleep(1)
        await register(registry, plan.spec, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(arrive)
        await status(plan, registry, screen, iterations=2)
    text = screen.text
    assert text.startswith("\x1b[?25l") and text.endswith("\x1b[?25h"), "cursor hidden, shown"
    first, _, rest = text[len("\x1b[?25l") :].partition("\r")
    height = first.count("\n") + 1
    erase = "\x1b[2K" + "\x1b[1A\x1b[2K" * (height - 1)  # up over the first view, line by line
    assert rest.startswith(erase), "the second view is drawn over the first"
    second = rest[len(erase) :].partition("\r")[0]
    assert [unstyled(view).splitlines()[0] for view in (first, second)] == [
        "0/4 registered, 4 missing: 0-3",  # live, the summary is on top: a tall table is cropped
        "1/4 registered, 3 missing: 0, 2, 3",
    ]
    assert unstyled(second).splitlines()[2].startswith("mesh unit: 4 ranks")


def unstyled(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


async def test_watch_keeps_the_last_members_through_an_outage(config, autojump_clock, capsys):
    plan = StatusPlan(load_spec(config), watch=True, json=True, interval=5)
    registry = MemoryRegistry()
    registry.fail()
    screen = Screen()

    async def weather() -> None:
        await trio.sleep(6)  # the first view (t=0) fails, the second (t=5) too
        registry.fail(False)
        await register(registry, plan.spec, 3)
        await trio.sleep(5)  # the third view (t=10) reads it
        registry.fail()  # the fourth (t=15) keeps it

    async with trio.open_nursery() as nursery:
        nursery.start_soon(weather)
        await status(plan, registry, screen, clock=wall_clock, iterations=4)
    documents = [json.loads(line) for line in screen.text.splitlines()]
    assert [doc["missing"] for doc in documents] == [[0, 1, 2], [0, 1, 2]]
    assert [note.split(":")[0] for note in documents[0]["notes"]] == ["no device columns"]
    assert documents[1]["notes"][0].startswith(
        "registry unreachable; members as read at 2023-11-14T22:13:30Z: reading the members"
    )
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2
    assert all(
        line.startswith("vnetd status: reading the members of mesh unit: ") for line in errors
    )
    assert all(line.endswith("; retrying every 5 s") for line in errors)


# --- through the CLI --------------------------------------------------------------------


def test_cli_unreachable_etcd_exits_2_with_one_line(config, capsys):
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    assert main(["status", "--config", str(config), "--etcd", "http://127.0.0.1:1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("vnetd: error: reading the members of mesh unit: ")
    assert err.endswith("check that etcd runs at http://127.0.0.1:1, or pass --etcd URL\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--interval", "0"],
            "vnetd: error: --interval: 0 is out of range; give 0.2 to 3600 seconds\n",
            id="interval-zero",
        ),
        pytest.param(
            ["--interval", "nan"],
            "vnetd: error: --interval: nan is out of range; give 0.2 to 3600 seconds\n",
            id="interval-nan",
        ),
        pytest.param(
            ["--etcd", "127.0.0.1:2379"],
            "vnetd: error: --etcd: '127.0.0.1:2379' is not an etcd URL like "
            "http://127.0.0.1:2379\n",
            id="etcd-url",
        ),
    ],
)
def test_cli_bad_input_exits_2(config, capsys, args, message):
    assert main(["status", "--config", str(config), *args]) == 2
    assert capsys.readouterr() == ("", message)


def test_cli_missing_config_exits_2(tmp_path, capsys):
    assert main(["status", "--config", str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err == f"vnetd: error: {tmp_path / 'nope.toml'}: no such file\n"


def test_cli_ctrl_c_ends_watch_quietly(config, capsys, monkeypatch):
    plans: list[StatusPlan] = []

    async def interrupted(plan: StatusPlan) -> int:
        plans.append(plan)
        raise KeyboardInterrupt

    monkeypatch.setattr("vnetd.commands.status.show.show_status", interrupted)
    args = ["status", "--config", str(config), "--watch", "--interval", "0.5"]
    assert main(args) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["status", "--config", str(config)]) == 130, "only --watch ends quietly"
    assert [(plan.watch, plan.interval) for plan in plans] == [(True, 0.5), (False, 2.0)]
