"""``vnetd render KIND`` and ``vnetd hosts`` end to end through ``vnetd.cli.main``."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from render_fixtures import EXAMPLE, LAB, key_pair, member, memory_opener, private_key

from vnetd.cli import main
from vnetd.render.flux import FluxOptions, render_flux
from vnetd.render.hosts import render_hosts_block
from vnetd.spec import load_spec


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_flux_to_stdout_and_to_file(capsys, tmp_path: Path):
    code, out, err = run(
        capsys, "render", "flux", "--config", str(EXAMPLE), "--fanout", "2", "--port", "9000"
    )
    assert (code, err) == (0, "")
    assert out == render_flux(load_spec(EXAMPLE), FluxOptions(port=9000, fanout=2))
    target = tmp_path / "bootstrap.toml"
    code, out, err = run(
        capsys, "render", "flux", "--config", str(EXAMPLE), "-o", str(target), "--bind", "interface"
    )
    assert (code, out, err) == (0, "", "")
    hosts = tomllib.loads(target.read_text())["bootstrap"]["hosts"]
    assert hosts[3] == {
        "host": "flux-sample-3",
        "bind": "tcp://vnet0:8050",
        "connect": "tcp://10.250.0.4:8050",
    }
    assert target.stat().st_mode & 0o777 == 0o644


def test_flux_ipv6_spec(capsys, lab6_config: Path):
    code, out, _ = run(capsys, "render", "flux", "--config", str(lab6_config))
    assert code == 0
    boot = tomllib.loads(out)["bootstrap"]
    assert boot["enable_ipv6"] is True
    assert boot["hosts"][0]["connect"] == "tcp://[fd00:250::1]:8050"


def test_hosts_top_level_and_render_hosts_are_the_same(capsys, lab_config: Path):
    args = ("--config", str(lab_config), "--domain", "cluster.local")
    top = run(capsys, "hosts", *args)
    under_render = run(capsys, "render", "hosts", *args)
    assert top == under_render
    assert top == (0, render_hosts_block(LAB, "cluster.local"), "")


def test_hosts_write_edits_a_file_idempotently(
    capsys, lab_config: Path, lab6_config: Path, tmp_path: Path
):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost")
    for _ in range(2):
        assert run(capsys, "hosts", "--config", str(lab_config), "--write", str(hosts)) == (
            0,
            "",
            "",
        )
    assert run(capsys, "render", "hosts", "--config", str(lab6_config), "--write", str(hosts)) == (
        0,
        "",
        "",
    )
    once = hosts.read_bytes()
    assert run(capsys, "hosts", "--config", str(lab_config), "--write", str(hosts)) == (0, "", "")
    assert hosts.read_bytes() == once
    text = once.decode()
    assert text.startswith(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n# BEGIN vnetd mesh lab\n"
    )
    assert text.count("# BEGIN vnetd mesh") == 2
    assert text.endswith("# END vnetd mesh lab6\n")


def test_hostfile(capsys, lab_config: Path, tmp_path: Path):
    code, out, _ = run(
        capsys,
        "render",
        "hostfile",
        "--config",
        str(lab_config),
        "--format",
        "plain",
        "--slots",
        "2",
    )
    assert code == 0
    assert out.splitlines() == [
        "10.250.0.1",
        "10.250.0.1",
        "10.250.0.2",
        "10.250.0.2",
        "10.250.0.3",
        "10.250.0.3",
        "10.250.0.4",
        "10.250.0.4",
    ]
    target = tmp_path / "hostfile"
    code, _, _ = run(
        capsys,
        "render",
        "hostfile",
        "--config",
        str(lab_config),
        "--names",
        "hostname",
        "-o",
        str(target),
    )
    assert code == 0
    assert target.read_text() == "lab-0 slots=1\nlab-1 slots=1\nlab-2 slots=1\nlab-3 slots=1\n"


def test_wg_quick_with_key_file(capsys, monkeypatch, lab_config: Path, tmp_path: Path):
    monkeypatch.setattr(
        "vnetd.commands.render.members.open_registry",
        memory_opener(LAB, [member(LAB, r) for r in range(4)]),
    )
    key = tmp_path / "private.key"
    key.write_text(private_key(2) + "\n")
    key.chmod(0o600)
    target = tmp_path / "vnet0.conf"
    code, out, err = run(
        capsys,
        "render",
        "wg-quick",
        "--config",
        str(lab_config),
        "--rank",
        "2",
        "--private-key-file",
        str(key),
        "-o",
        str(target),
    )
    assert (code, out, err) == (0, "", "")
    text = target.read_text()
    assert f"PrivateKey = {private_key(2)}\n" in text
    assert text.count("[Peer]") == 3
    assert target.stat().st_mode & 0o777 == 0o600


def test_wg_quick_placeholder_and_unregistered_warn(capsys, monkeypatch, lab_config: Path):
    monkeypatch.setattr(
        "vnetd.commands.render.members.open_registry", memory_opener(LAB, [member(LAB, 0)])
    )
    code, out, err = run(capsys, "render", "wg-quick", "--config", str(lab_config), "--rank", "1")
    assert code == 0
    assert "PrivateKey = <private key of rank 1: put it here>\n" in out
    assert err.splitlines() == [
        "vnetd: warning: PrivateKey is a placeholder: put the private key of rank 1 there, or pass --private-key-file",
        "vnetd: warning: rank 1 is not registered: the cluster's daemons will not add this machine as a peer until it is",
    ]


def test_wg_quick_other_key_warns_without_leaking_the_private_key(
    capsys, monkeypatch, lab_config: Path, tmp_path: Path
):
    monkeypatch.setattr(
        "vnetd.commands.render.members.open_registry", memory_opener(LAB, [member(LAB, 1, key=6)])
    )
    key = tmp_path / "k"
    key.write_text(private_key(1))
    key.chmod(0o600)
    code, out, err = run(
        capsys,
        "render",
        "wg-quick",
        "--config",
        str(lab_config),
        "--rank",
        "1",
        "--private-key-file",
        str(key),
    )
    assert code == 0
    assert err == (
        f"vnetd: warning: rank 1 is registered with public key {key_pair(6).public_key}, not this key's "
        f"{key_pair(1).public_key}: the cluster's daemons will not accept this machine\n"
    )
    assert private_key(1) not in err
    assert out.count(private_key(1)) == 1


def test_wg_quick_unreachable_etcd(capsys, lab_config: Path):
    code, out, err = run(
        capsys,
        "render",
        "wg-quick",
        "--config",
        str(lab_config),
        "--rank",
        "0",
        "--etcd",
        "http://127.0.0.1:1",
    )
    assert (code, out) == (2, "")
    assert err.startswith("vnetd: error: reading the members of mesh lab: ")
    assert err.endswith("check that etcd runs at http://127.0.0.1:1, or pass --etcd URL\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["render", "flux", "--fanout", "0"],
            r"--fanout: 0 is out of range \(at least 1\)",
            id="fanout-0",
        ),
        pytest.param(
            ["render", "flux", "--port", "70000"],
            r"--port: 70000 is out of range \(1\.\.65535\)",
            id="port-70000",
        ),
        pytest.param(["render", "flux", "--port", "0"], r"--port: 0 is out of range", id="port-0"),
        pytest.param(
            ["render", "flux", "--curve-cert", "a\nb"],
            r"--curve-cert: .* without control characters",
            id="curve-cert-newline",
        ),
        pytest.param(
            ["render", "flux", "--family", "6"],
            r"^vnetd: error: --family 6: mesh lab has no IPv6 network \(add mesh\.network6 to "
            r"the spec\); leave --family out$",
            id="flux-family6-of-ipv4-mesh",
        ),
        pytest.param(
            ["render", "hostfile", "--family", "6"],
            r"--family 6: mesh lab has no IPv6 network",
            id="hostfile-family6-of-ipv4-mesh",
        ),
        pytest.param(
            ["render", "hostfile", "--slots", "0"],
            r"--slots: 0 is out of range \(at least 1\)",
            id="slots-0",
        ),
        pytest.param(
            ["hosts", "--domain", "bad domain"],
            r"--domain: 'bad domain' is not a DNS domain",
            id="domain-space",
        ),
        pytest.param(
            ["render", "hosts", "--domain", "example.org."],
            r"--domain: .*trailing",
            id="domain-trailing-dot",
        ),
        pytest.param(
            ["render", "wg-quick", "--rank", "4"],
            r"--rank: 4 is out of range: mesh lab has ranks 0\.\.3",
            id="rank-too-big",
        ),
        pytest.param(
            ["render", "wg-quick", "--rank", "-1"],
            r"--rank: -1 is out of range",
            id="rank-negative",
        ),
        pytest.param(
            ["render", "wg-quick", "--rank", "0", "--etcd", "127.0.0.1:2379"],
            r"--etcd: .*not an etcd URL",
            id="bad-etcd-url",
        ),
        pytest.param(
            ["render", "wg-quick", "--rank", "0", "--private-key-file", "/nonexistent/k"],
            r"--private-key-file /nonexistent/k: no such file",
            id="key-missing",
        ),
    ],
)
def test_flag_errors(capsys, lab_config: Path, argv: list[str], message: str):
    code, out, err = run(capsys, *argv, "--config", str(lab_config))
    assert (code, out) == (2, "")
    assert err.startswith("vnetd: error: ") and err.count("\n") == 1
    assert re.search(message, err), err


def test_key_file_readable_by_others_is_refused(capsys, lab_config: Path, tmp_path: Path):
    key = tmp_path / "k"
    key.write_text(private_key(0))
    key.chmod(0o644)
    code, _, err = run(
        capsys,
        "render",
        "wg-quick",
        "--config",
        str(lab_config),
        "--rank",
        "0",
        "--private-key-file",
        str(key),
    )
    assert code == 2
    assert (
        err
        == f"vnetd: error: --private-key-file {key}: mode 0644 lets others read the private key; run chmod 600 {key}\n"
    )


def test_mpich_ipv6_addresses_are_refused(capsys, lab6_config: Path):
    code, _, err = run(
        capsys, "render", "hostfile", "--config", str(lab6_config), "--format", "mpich"
    )
    assert code == 2
    assert "--format mpich:" in err and "--names hostname" in err


def test_family_4_of_an_ipv6_only_mesh_is_refused(capsys, lab6_config: Path):
    code, _, err = run(capsys, "render", "hostfile", "--config", str(lab6_config), "--family", "4")
    assert code == 2
    assert err == (
        "vnetd: error: --family 4: mesh lab6 has no IPv4 network (the mesh is IPv6 only); "
        "leave --family out\n"
    )


def test_family_chooses_the_addresses_of_a_dual_stack_mesh(capsys, dual_config: Path):
    config = ("--config", str(dual_config))
    code, out, _ = run(capsys, "render", "hostfile", *config)
    assert (code, out.split("\n")[0]) == (0, "10.250.0.1 slots=1")
    code, out, _ = run(capsys, "render", "hostfile", *config, "--family", "6")
    assert (code, out.split("\n")[0]) == (0, "fd00:250::1 slots=1")
    code, out, _ = run(capsys, "render", "flux", *config, "--family", "6")
    boot = tomllib.loads(out)["bootstrap"]
    assert (code, boot["enable_ipv6"], boot["hosts"][2]["connect"]) == (
        0,
        True,
        "tcp://[fd00:250::3]:8050",
    )
    code, out, _ = run(capsys, "render", "flux", *config, "--family", "4")
    assert "enable_ipv6" not in tomllib.loads(out)["bootstrap"]
    code, out, _ = run(capsys, "hosts", *config)
    assert out.splitlines()[2:4] == ["10.250.0.1\tds-0", "fd00:250::1\tds-0"]


def test_mpich_with_family_6_of_a_dual_stack_mesh_is_refused(capsys, dual_config: Path):
    code, _, err = run(capsys, "render", "hostfile", "--config", str(dual_config),
                       "--format", "mpich", "--family", "6")  # fmt: skip
    assert code == 2
    assert err.endswith("cannot read IPv6 addresses; add --names hostname or --family 4\n")


def test_broken_hosts_file_is_an_error(capsys, lab_config: Path, tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# END vnetd mesh lab\n")
    code, _, err = run(capsys, "hosts", "--config", str(lab_config), "--write", str(hosts))
    assert code == 2
    assert err.startswith(f"vnetd: error: {hosts}: line 1 holds '# END vnetd mesh lab'")
    assert hosts.read_text() == "# END vnetd mesh lab\n"


def test_missing_config(capsys, tmp_path: Path):
    code, _, err = run(capsys, "render", "flux", "--config", str(tmp_path / "none.toml"))
    assert code == 2
    assert err == f"vnetd: error: {tmp_path / 'none.toml'}: no such file\n"


def test_output_and_write_are_exclusive(capsys, lab_config: Path, tmp_path: Path):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "hosts",
                "--config",
                str(lab_config),
                "-o",
                str(tmp_path / "a"),
                "--write",
                str(tmp_path / "b"),
            ]
        )
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_pure_renderers_import_no_io_libraries():
    code = (
        "import sys\n"
        "import vnetd.render.flux, vnetd.render.hosts, vnetd.render.hostfile, vnetd.render.wgquick\n"
        "print(sorted(m for m in ('trio', 'httpx', 'pyroute2') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout == "[]\n"


def test_run_functions_take_injected_seams(capsys, lab_config: Path, tmp_path: Path):
    """The registry opener of wg-quick and the rename of hosts --write can be injected."""
    from vnetd.cli import build_parser
    from vnetd.commands.render.command import run_hosts, run_wg_quick

    args = build_parser().parse_args(
        ["render", "wg-quick", "--config", str(lab_config), "--rank", "3"]
    )
    assert (
        run_wg_quick(args, open_registry=memory_opener(LAB, [member(LAB, 0), member(LAB, 3)])) == 0
    )
    out, _ = capsys.readouterr()
    assert "# rank 0 lab-0\n[Peer]\n" in out

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")

    def busy(src: str, dst: str) -> None:
        raise OSError(16, "Device or resource busy")

    args = build_parser().parse_args(["hosts", "--config", str(lab_config), "--write", str(hosts)])
    assert run_hosts(args, rename=busy) == 0
    assert hosts.read_text() == "127.0.0.1 localhost\n" + render_hosts_block(LAB)
    assert capsys.readouterr().err == (
        f"vnetd: warning: {hosts} was rewritten in place, not atomically, because it is a mount point "
        "(rename failed: Device or resource busy)\n"
    )
