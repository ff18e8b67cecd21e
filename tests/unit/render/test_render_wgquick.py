from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from render_fixtures import DUAL, LAB, LAB6, key_pair, member, memory_opener, private_key

from vnetd.commands.render.members import read_members_now
from vnetd.errors import IdentityError, RegistryUnavailable, SpecError
from vnetd.keys import load_private_key
from vnetd.model import KeyPair, Member
from vnetd.registry.memory import MemoryRegistry
from vnetd.render.wgquick import registration_problem, render_wg_quick
from vnetd.spec import MeshSpec


def members_of(*entries: Member) -> dict[int, Member]:
    return {m.rank: m for m in entries}


CASES = [
    pytest.param(
        LAB,
        1,
        members_of(*(member(LAB, r) for r in range(4))),
        key_pair(1),
        "wg-quick-lab-rank1.conf",
        id="ipv4-registered",
    ),
    pytest.param(
        LAB6,
        0,
        members_of(
            member(LAB6, 0), member(LAB6, 1), member(LAB6, 2, endpoint=None), member(LAB6, 4)
        ),
        None,
        "wg-quick-lab6-rank0-placeholder.conf",
        id="ipv6-placeholder-keepalive-no-endpoint",
    ),
    pytest.param(
        LAB,
        3,
        members_of(member(LAB, 0), member(LAB, 2)),
        key_pair(3),
        "wg-quick-lab-rank3-unregistered.conf",
        id="not-registered",
    ),
    pytest.param(
        LAB,
        2,
        members_of(member(LAB, 0), member(LAB, 2, key=7)),
        key_pair(2),
        "wg-quick-lab-rank2-other-key.conf",
        id="registered-with-other-key",
    ),
    pytest.param(
        LAB,
        0,
        members_of(member(LAB, 0), member(LAB, 1), member(LAB, 2, key=1), member(LAB, 3, key=0)),
        key_pair(0),
        "wg-quick-lab-rank0-duplicate-keys.conf",
        id="duplicate-keys-left-out",
    ),
    pytest.param(LAB, 0, {}, None, "wg-quick-lab-rank0-empty.conf", id="empty-registry"),
    pytest.param(
        DUAL,
        1,
        members_of(*(member(DUAL, r) for r in range(3))),
        key_pair(1),
        "wg-quick-ds-rank1.conf",
        id="dual-stack",
    ),
]


@pytest.mark.parametrize(("spec", "rank", "members", "key", "name"), CASES)
def test_wg_quick_matches_golden(
    spec: MeshSpec, rank: int, members, key: KeyPair | None, name: str, golden
):
    golden(name, render_wg_quick(spec, rank, members, key))


@pytest.mark.parametrize(("spec", "rank", "members", "key", "name"), CASES)
def test_wg_quick_sections(spec: MeshSpec, rank: int, members, key: KeyPair | None, name: str):
    text = render_wg_quick(spec, rank, members, key)
    lines = text.splitlines()
    assert text.endswith("\n")
    assert lines.count("[Interface]") == 1
    addresses = ", ".join(str(addr) for addr in spec.interface_addresses(rank))
    assert f"Address = {addresses}" in lines
    assert f"ListenPort = {spec.port}" in lines
    assert f"MTU = {spec.mtu}" in lines
    private = key.private_key if key else f"<private key of rank {rank}: put it here>"
    assert [line for line in lines if line.startswith("PrivateKey")] == [f"PrivateKey = {private}"]
    if key:
        assert text.count(key.private_key) == 1, "the private key must appear only in PrivateKey"
    # Peer ranks in order, each preceded by its comment, never the rank itself.
    peer_ranks = [int(lines[i - 1].split()[2]) for i, line in enumerate(lines) if line == "[Peer]"]
    assert peer_ranks == sorted(peer_ranks)
    assert rank not in peer_ranks
    assert text.count("PersistentKeepalive") == (
        len(peer_ranks) if spec.persistent_keepalive else 0
    )


def test_wg_quick_peer_fields():
    members = members_of(member(LAB6, 0), member(LAB6, 3, endpoint=None))
    text = render_wg_quick(LAB6, 0, members, key_pair(0))
    peer = text.split("# rank 3 lab6-3\n", 1)[1]
    assert peer == (
        f"[Peer]\nPublicKey = {key_pair(3).public_key}\nAllowedIPs = fd00:250::4/128\nPersistentKeepalive = 25\n"
    )


@pytest.mark.parametrize(
    ("members", "public_key", "problem"),
    [
        pytest.param(members_of(member(LAB, 1)), key_pair(1).public_key, None, id="registered"),
        pytest.param(members_of(member(LAB, 1)), None, None, id="registered-no-key-file"),
        pytest.param(
            members_of(member(LAB, 0)),
            key_pair(1).public_key,
            "rank 1 is not registered",
            id="absent",
        ),
        pytest.param({}, None, "rank 1 is not registered", id="absent-no-key-file"),
        pytest.param(
            members_of(member(LAB, 1, key=5)),
            key_pair(1).public_key,
            f"rank 1 is registered with public key {key_pair(5).public_key}, not this key's {key_pair(1).public_key}",
            id="other-key",
        ),
    ],
)
def test_registration_problem(members, public_key: str | None, problem: str | None):
    found = registration_problem(1, members, public_key)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


def test_wg_quick_rank_out_of_range():
    with pytest.raises(SpecError, match="rank 4 is out of range"):
        render_wg_quick(LAB, 4, {}, None)


def write_key(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        pytest.param(private_key(4) + "\n", 0o600, id="one-line"),
        pytest.param(private_key(4), 0o400, id="no-newline-read-only"),
        pytest.param(f"  {private_key(4)}\r\n", 0o600, id="whitespace"),
    ],
)
def test_key_file_loads(tmp_path: Path, text: str, mode: int):
    pair = load_private_key(write_key(tmp_path / "k", text, mode))
    assert pair == key_pair(4)
    assert private_key(4) not in repr(pair)


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        pytest.param(
            private_key(4),
            0o640,
            r"mode 0640 lets others read the private key; run chmod 600",
            id="group-readable",
        ),
        pytest.param(private_key(4), 0o604, r"mode 0604 lets others", id="world-readable"),
        pytest.param(private_key(4), 0o620, r"mode 0620 lets others", id="group-writable"),
        pytest.param("not a key\n", 0o600, r"not a base64 X25519 private key", id="not-base64"),
        pytest.param(
            base64.b64encode(b"x" * 31).decode(), 0o600, r"not a base64 X25519", id="short"
        ),
        pytest.param(
            private_key(4) + "\n" + private_key(5), 0o600, r"not a base64 X25519", id="two-lines"
        ),
        pytest.param("\xe9", 0o600, r"not a base64 X25519", id="not-ascii"),
    ],
)
def test_key_file_errors(tmp_path: Path, text: str, mode: int, message: str):
    path = write_key(tmp_path / "k", text, mode)
    with pytest.raises(IdentityError, match=rf"^--private-key-file {path}: {message}") as info:
        load_private_key(path)
    assert private_key(4) not in str(info.value)


def test_key_file_missing_or_directory(tmp_path: Path):
    with pytest.raises(IdentityError, match="no such file"):
        load_private_key(tmp_path / "absent")
    with pytest.raises(IdentityError, match="not a regular file"):
        load_private_key(tmp_path)


def test_read_members_from_registry():
    expected = [member(LAB, 0), member(LAB, 3, endpoint=None)]
    members, bad = read_members_now(LAB, memory_opener(LAB, expected, bad=2))
    assert members == {0: expected[0], 3: expected[1]}
    assert bad == 2


def test_read_members_registry_unavailable():
    with pytest.raises(
        RegistryUnavailable,
        match=r"^reading the members of mesh lab: .*; check that etcd runs at http://127\.0\.0\.1:2379, or pass --etcd URL$",
    ):
        read_members_now(LAB, memory_opener(LAB, [], fail=True))


class HangingRegistry(MemoryRegistry):
    async def list_prefix(self, prefix: str):
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def test_read_members_times_out():
    @asynccontextmanager
    async def open_hanging(endpoints: Sequence[str]) -> AsyncIterator[MemoryRegistry]:
        yield HangingRegistry()

    with pytest.raises(
        RegistryUnavailable, match=r"no answer within 0\.05 s; check that etcd runs"
    ):
        read_members_now(LAB, open_hanging, timeout=0.05)


def test_dual_stack_wg_quick_has_both_addresses_and_both_allowed_ips():
    members = members_of(*(member(DUAL, r) for r in range(3)))
    lines = render_wg_quick(DUAL, 1, members, key_pair(1)).splitlines()
    assert "Address = 10.250.0.2/24, fd00:250::2/64" in lines
    assert [line for line in lines if line.startswith("AllowedIPs")] == [
        "AllowedIPs = 10.250.0.1/32, fd00:250::1/128",
        "AllowedIPs = 10.250.0.3/32, fd00:250::3/128",
    ]
