"""The record signing key from a file (``--signing-key-file``, ``VNETD_SIGNING_KEY_FILE``,
``[wireguard] signing_key_file``), the file ``vnetd signing-key --create --key-file``
makes, and the init container the site manifests copy a pinned gateway's key with
(docs/security.md, "Gateway ranks"). The e2e twin is
``tests/e2e/test_pinned_gateway.py::test_a_gateway_with_a_fresh_state_dir_and_its_key_file_keeps_its_rank``.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from shared import daemon_settings

from vnetd.cli import main
from vnetd.config import Settings
from vnetd.control.proof import SIGNING_KEY_FILE, Signer, create_signer_file, load_signer
from vnetd.daemon.root import prepare
from vnetd.errors import IdentityError, SpecError
from vnetd.identity import resolve_signing_key_file
from vnetd.render.podscripts import SIGNING_KEY_SCRIPT
from vnetd.render.secretfiles import secret_files
from vnetd.spec import load_spec, parse_spec

POD_ENV = {"POD_IP": "198.18.1.1"}
PUBLIC = base64.b64encode(bytes(range(32))).decode()


def key_file(tmp_path: Path, name: str = "gateway-4.key", mode: int = 0o600) -> Path:
    path = tmp_path / name
    create_signer_file(path, "--key-file")
    path.chmod(mode)
    return path


def spec_file(tmp_path: Path, pinned: str | None = None, extra: str = "") -> Path:
    pins = f'gateway_keys = {{ 4 = "{pinned}" }}\n' if pinned else ""
    path = tmp_path / "mesh.toml"
    path.write_text(
        '[mesh]\nname = "m"\nsize = 8\nnetwork = "10.250.0.0/16"\n'
        f"[sites.b]\ngateways = [4, 5]\n{pins}{extra}"
    )
    return path


def settings(tmp_path: Path, state: str, flag: Path | None = None, **kw: Any) -> Settings:  # noqa: ANN401
    return Settings(
        spec=load_spec(kw.pop("config", None) or spec_file(tmp_path)),
        rank="4",
        state_dir=tmp_path / state,
        signing_key_file=str(flag) if flag else None,
        **kw,
    )


# --- vnetd signing-key --create --key-file ----------------------------------------------------


def test_create_makes_a_new_0600_key_file_and_never_overwrites_one(tmp_path: Path, capsys) -> None:
    path = tmp_path / "gateway-4.key"
    assert main(["signing-key", "--create", "--key-file", str(path)]) == 0
    printed = capsys.readouterr().out.strip()
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_signer(path).public_key == printed
    assert path.read_text().strip() not in printed
    assert [p.name for p in tmp_path.iterdir()] == ["gateway-4.key"]  # no temporary left
    before = path.read_bytes()
    assert main(["signing-key", "--create", "--key-file", str(path)]) == 2
    assert "exists; a key file is never overwritten" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert main(["signing-key", "--key-file", str(path)]) == 0  # prints the same key
    assert capsys.readouterr().out.strip() == printed


def test_create_refuses_a_symlink_where_the_file_goes(tmp_path: Path, capsys) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    (tmp_path / "k.key").symlink_to(target)
    assert main(["signing-key", "--create", "--key-file", str(tmp_path / "k.key")]) == 2
    assert "exists" in capsys.readouterr().err
    assert target.read_text() == "untouched\n"


# --- the daemon's signing key -----------------------------------------------------------------


def test_a_key_file_signs_instead_of_the_state_dir_and_survives_a_fresh_state_dir(
    tmp_path: Path,
) -> None:
    path = key_file(tmp_path)
    pinned = load_signer(path).public_key
    config = spec_file(tmp_path, pinned)
    for state in ("state-1", "state-2"):  # a rescheduled pod: a new, empty state dir
        opts = settings(tmp_path, state, path, config=config)
        me, _config, signer = prepare(daemon_settings(opts, POD_ENV), 4)
        assert me.rank == 4 and me.signing_key == signer.public_key == pinned
        assert not (tmp_path / state / SIGNING_KEY_FILE).exists()
    # Without the file, the fresh state dir makes a key of its own: the pin refuses it.
    with pytest.raises(IdentityError, match=r"sites\.b\.gateway_keys\.4 pins its signing key"):
        prepare(daemon_settings(settings(tmp_path, "state-3", config=config), POD_ENV), 4)


def test_a_secret_file_of_mode_0400_is_taken(tmp_path: Path) -> None:
    path = key_file(tmp_path, mode=0o400)
    me, _c, _s = prepare(daemon_settings(settings(tmp_path, "state", path), POD_ENV), 4)
    assert me.signing_key == load_signer(path).public_key


@pytest.mark.parametrize(
    ("flag", "env", "table", "expected"),
    [
        pytest.param("f", "e", "t", "f", id="flag-first"),
        pytest.param(None, "e", "t", "e", id="env-next"),
        pytest.param(None, None, "t", "t", id="spec-last"),
        pytest.param(None, None, None, None, id="none-state-dir"),
    ],
)
def test_the_key_file_is_the_flag_then_the_environment_then_the_spec(
    tmp_path: Path, flag: str | None, env: str | None, table: str | None, expected: str | None
) -> None:
    keys = {name: key_file(tmp_path, f"{name}.key") for name in "fet"}
    extra = f'[wireguard]\nsigning_key_file = "{keys["t"]}"\n' if table else ""
    config = spec_file(tmp_path, extra=extra)
    environ = {**POD_ENV, **({"VNETD_SIGNING_KEY_FILE": str(keys["e"])} if env else {})}
    opts = settings(tmp_path, "state", keys["f"] if flag else None, config=config)
    me, _c, _s = prepare(daemon_settings(opts, environ), 4)
    if expected is None:
        assert me.signing_key == load_signer(tmp_path / "state" / SIGNING_KEY_FILE).public_key
    else:
        assert me.signing_key == load_signer(keys[expected]).public_key
    source = {"f": "--signing-key-file", "e": "VNETD_SIGNING_KEY_FILE",
              "t": "wireguard.signing_key_file"}  # fmt: skip
    named = resolve_signing_key_file(opts.signing_key_file, environ, opts.spec)
    assert named == (None if expected is None else (source[expected], keys[expected]))


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        pytest.param(None, 0, r"cannot use the signing key: No such file", id="missing"),
        pytest.param("nope\n", 0o600, r"not a base64 Ed25519 private key \(make one with "
                     r"`vnetd signing-key --create --key-file FILE`\)$", id="not-a-key"),
        pytest.param("x", 0o644, r"mode 0644 lets others read the signing key; run chmod 600",
                     id="loose"),
    ],
)  # fmt: skip
def test_a_bad_key_file_is_one_line_naming_the_flag(
    tmp_path: Path, text: str | None, mode: int, message: str
) -> None:
    path = tmp_path / "bad.key"
    if text is not None:
        path.write_text(text)
        path.chmod(mode)
    with pytest.raises(IdentityError, match=rf"^--signing-key-file {path}: {message}"):
        prepare(daemon_settings(settings(tmp_path, "state", path), POD_ENV), 4)


def test_register_signs_with_the_key_file_and_names_it_against_a_pin(
    tmp_path: Path, capsys
) -> None:
    path = key_file(tmp_path)
    config = spec_file(tmp_path, Signer.generate().public_key)  # pinned to another key
    argv = ["register", "--config", str(config), "--rank", "4",
            "--public-key", PUBLIC, "--endpoint", "198.18.1.9:51820",
            "--signing-key-file", str(path)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"this signing key (--signing-key-file {path}) is" in err, err
    assert "--signing-key-file FILE" in err


# --- the manifests' copy of a pinned gateway's key --------------------------------------------


def copy_key(secret: Path, rank: int, state: Path) -> str:
    result = subprocess.run(
        ["sh", "-c", SIGNING_KEY_SCRIPT, "signing-key", str(secret), str(rank), str(state)],
        capture_output=True,
        check=True,
        timeout=10,
    )
    return result.stdout.decode()


def test_the_init_container_copies_its_own_gateway_key_only(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    gateway = key_file(secret, "gateway-4.key", mode=0o400)  # as a Secret volume holds it
    state4, state5 = tmp_path / "state-4", tmp_path / "state-5"
    state4.mkdir(mode=0o777)
    os.chmod(state4, 0o777)  # an emptyDir
    assert "rank 4's pinned key from the Secret" in copy_key(secret, 4, state4)
    assert (state4.stat().st_mode & 0o777, (state4 / "signing.key").stat().st_mode & 0o777) == (
        0o700, 0o600
    )  # fmt: skip
    assert load_signer(state4 / "signing.key").public_key == load_signer(gateway).public_key
    assert sorted(p.name for p in state4.iterdir()) == ["signing.key"]
    assert "none in the Secret for rank 5" in copy_key(secret, 5, state5)
    assert not state5.exists()


def test_render_refuses_a_spec_that_names_a_signing_key_file() -> None:
    spec = parse_spec(
        {
            "mesh": {"name": "m", "size": 8, "network": "10.250.0.0/16"},
            "wireguard": {"signing_key_file": "/etc/vnetd/gw.key"},
        }
    )
    with pytest.raises(SpecError, match=r"^wireguard\.signing_key_file: .* one rank's; .*"
                       r"vnetd-gateway-signing-keys"):  # fmt: skip
        secret_files(spec, ())
