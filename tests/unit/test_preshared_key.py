"""The mesh-wide pre-shared key: loading it, and handing it to each data plane."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from shared import daemon_settings

from vnetd.config import Settings
from vnetd.daemon.root import prepare
from vnetd.dataplane.codec.uapi_protocol import plan_lines
from vnetd.dataplane.kernel.device import peer_messages
from vnetd.errors import IdentityError
from vnetd.keys import load_preshared_key
from vnetd.model import Peer, Plan
from vnetd.spec import load_spec

PSK = base64.b64encode(bytes(range(100, 132))).decode()
PEER = base64.b64encode(bytes(range(32))).decode()


def psk_file(tmp_path: Path, text: str = PSK, mode: int = 0o600, name: str = "psk") -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_a_good_key_file_loads(tmp_path: Path) -> None:
    assert load_preshared_key(psk_file(tmp_path)) == PSK


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [
        pytest.param(PSK, 0o644, "lets others read the pre-shared key; run chmod 600", id="loose"),
        pytest.param(PSK, 0o640, "lets others read", id="group"),
        pytest.param("not base64!", 0o600, "not a base64 32-byte key", id="junk"),
        pytest.param(base64.b64encode(b"short").decode(), 0o600, "32-byte", id="short"),
    ],
)
def test_a_bad_key_file_is_refused_without_echoing_it(
    tmp_path: Path, text: str, mode: int, why: str
) -> None:
    with pytest.raises(IdentityError, match=why) as caught:
        load_preshared_key(psk_file(tmp_path, text, mode))
    assert PSK not in str(caught.value)


def test_a_missing_key_file_names_the_source(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="VNETD_PRESHARED_KEY_FILE .*cannot read"):
        load_preshared_key(tmp_path / "absent", "VNETD_PRESHARED_KEY_FILE")


def test_uapi_lines_carry_the_key_for_added_peers_only() -> None:
    plan = Plan(add=(Peer(PEER, ("10.250.0.2/32",), "198.18.1.1:51820"),))
    lines = plan_lines(plan, 0, PSK)
    assert lines[:2] == [
        ("public_key", bytes(range(32)).hex()),
        ("preshared_key", bytes(range(100, 132)).hex()),
    ]
    assert ("preshared_key", bytes(range(100, 132)).hex()) not in plan_lines(plan, 0, None)
    removal = plan_lines(Plan(remove=(Peer(PEER, ()),)), 0, PSK)
    assert all(key != "preshared_key" for key, _ in removal)


def test_kernel_messages_carry_the_key_for_added_peers() -> None:
    plan = Plan(add=(Peer(PEER, ("10.250.0.2/32",), "198.18.1.1:51820"),))
    assert peer_messages(plan, 0, PSK)[0]["preshared_key"] == PSK
    assert "preshared_key" not in peer_messages(plan, 0, None)[0]


def spec_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(f'[mesh]\nname = "m"\nsize = 2\nnetwork = "10.250.0.0/16"\nmtu = 1420\n{extra}')
    return path


@pytest.mark.parametrize(
    ("flag", "env", "table", "expected"),
    [
        pytest.param("a", None, None, "a", id="flag"),
        pytest.param(None, "b", "c", "b", id="env-over-spec"),
        pytest.param(None, None, "c", "c", id="spec"),
        pytest.param("a", "b", "c", "a", id="flag-over-all"),
        pytest.param(None, None, None, None, id="none"),
    ],
)
def test_the_key_file_is_chosen_flag_env_spec(
    tmp_path: Path, flag: str | None, env: str | None, table: str | None, expected: str | None
) -> None:
    keys = {}
    for name, fill in (("a", 1), ("b", 2), ("c", 3)):
        keys[name] = base64.b64encode(bytes([fill]) * 32).decode()
        psk_file(tmp_path, keys[name], name=name)
    extra = f'[wireguard]\npreshared_key_file = "{tmp_path / table}"\n' if table else ""
    opts = Settings(
        spec=load_spec(spec_file(tmp_path, extra)),
        rank="0",
        state_dir=tmp_path / "state",
        preshared_key_file=str(tmp_path / flag) if flag else None,
    )
    environ = {"POD_IP": "198.18.1.1"}
    if env:
        environ["VNETD_PRESHARED_KEY_FILE"] = str(tmp_path / env)
    _me, config, _signer = prepare(daemon_settings(opts, environ), 0)
    assert config.preshared_key == (keys[expected] if expected else None)
    assert (config.preshared_key or "@@") not in repr(config)
