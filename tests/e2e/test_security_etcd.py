"""vnetd through a secured etcd: TLS with client certificates, and username/password auth.

Each test builds a 2-pod lab whose etcd is secured, has both daemons join
through it (a peer appears on each device, the pods reach each other), and
checks that each credential mistake a user can make is one clear line from
``vnetd status`` (exit 2). The daemons watch over either transport (``--etcd-watch``):
the gRPC watch takes the same TLS files and the same auth token.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio
from bounds import form
from tlscerts import TestCA

from vnetd.control.membership import members_prefix
from vnetd.lab.cluster import MeshLab
from vnetd.lab.etcd import EtcdTls
from vnetd.lab.open_lab import ETCD_IP, Lab, open_lab


async def status_in_pod(
    mesh: MeshLab, *flags: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """``vnetd status`` run in pod 0's network namespace: (exit code, stderr)."""
    prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())]
    argv = [
        *prefix,
        sys.executable,
        "-m",
        "vnetd",
        "status",
        "--config",
        str(mesh.spec_path),
        *flags,
    ]
    result = await mesh.lab.run(mesh.pod(0), argv, 30)
    return result.returncode, result.stderr.decode(errors="replace").strip()


def assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


async def join_two(
    mesh: MeshLab, flags0: list[str], flags1: list[str], env1: dict[str, str]
) -> None:
    """Start ranks 0 and 1 and wait until each has the other as a peer and reaches it."""
    await mesh.start_probes()
    await mesh.start_rank(0, *flags0)
    pod = mesh.pod(1)
    argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path), "--rank", "1",
            "--state-dir", str(pod.state_dir), *flags1]  # fmt: skip
    mesh.started_at[1] = time.monotonic()
    mesh.daemons[1] = await mesh.lab.start(
        pod, argv, {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name, **env1}
    )
    await form(mesh, what="both ranks reach each other")
    assert not mesh.dead_daemons()
    assert await mesh.device_ranks(0) == {1}
    assert await mesh.device_ranks(1) == {0}


@pytest.mark.parametrize("watch", [pytest.param("json", id="json-watch"),
                                   pytest.param("grpc", id="grpc-watch")])  # fmt: skip
async def test_daemons_join_through_etcd_with_tls_and_client_certificates(
    tmp_path: Path, watch: str
) -> None:
    ca = TestCA(tmp_path / "pki")
    server = ca.issue("etcd-server", ips=(ETCD_IP, "127.0.0.1"))
    client = ca.issue("vnetd-client")
    expired = ca.issue("vnetd-expired", expired=True)
    stranger = TestCA(tmp_path / "other", name="some-other-ca")
    tls = EtcdTls(ca.ca_file, server.cert, server.key, client_cert_auth=True,
                  client_cert=client.cert, client_key=client.key)  # fmt: skip
    with trio.fail_after(150):
        async with open_lab(2, with_etcd=False) as lab:
            await lab.start_etcd(tls=tls)
            assert lab.etcd_url.startswith("https://")
            mesh = MeshLab.create(lab)
            flags = ["--etcd-ca", str(ca.ca_file), "--etcd-cert", str(client.cert),
                     "--etcd-key", str(client.key)]  # fmt: skip
            env = {"VNETD_ETCD_CA": str(ca.ca_file), "VNETD_ETCD_CERT": str(client.cert),
                   "VNETD_ETCD_KEY": str(client.key)}  # fmt: skip
            await join_two(mesh, [*flags, "--etcd-watch", watch], [],
                           {**env, "VNETD_ETCD_WATCH": watch})  # fmt: skip

            code, err = await status_in_pod(mesh, *flags, "--json")
            assert code == 0, err
            for daemon in mesh.daemons.values():  # the watch took the TLS files: never refused
                assert "during watch" not in daemon.log_text()

            wrong_ca = ["--etcd-ca", str(stranger.ca_file), *flags[2:]]
            assert_one_line(*await status_in_pod(mesh, *wrong_ca),
                            "certificate verify failed", "--etcd-ca")  # fmt: skip
            old_cert = [
                *flags[:2],
                "--etcd-cert",
                str(expired.cert),
                "--etcd-key",
                str(expired.key),
            ]
            code, err = await status_in_pod(mesh, *old_cert)
            print(f"expired client certificate: {err}")
            assert_one_line(code, err, "expired", "--etcd-cert")
            code, err = await status_in_pod(mesh, *flags[:2])
            print(f"no client certificate: {err}")
            assert_one_line(code, err, "etcd", "--etcd-cert")


async def enable_auth(lab: Lab, prefix: str) -> None:
    """root, a role readwrite on ``prefix`` only and its user vnetd; an outsider; auth on."""
    for args in (
        ("user", "add", "root:root-secret"),
        ("user", "grant-role", "root", "root"),
        ("role", "add", "vnetd-lab"),
        ("role", "grant-permission", "vnetd-lab", "--prefix=true", "readwrite", prefix),
        ("user", "add", "vnetd:s3cret-Pa55"),
        ("user", "grant-role", "vnetd", "vnetd-lab"),
        ("role", "add", "elsewhere"),
        ("role", "grant-permission", "elsewhere", "--prefix=true", "readwrite", "/other/"),
        ("user", "add", "outsider:outsider-pw"),
        ("user", "grant-role", "outsider", "elsewhere"),
        ("auth", "enable"),
    ):
        await lab.etcdctl(*args)
    lab.etcdctl_flags += ["--user", "root:root-secret"]


@pytest.mark.parametrize("watch", [pytest.param("json", id="json-watch"),
                                   pytest.param("grpc", id="grpc-watch")])  # fmt: skip
async def test_daemons_join_through_etcd_with_auth_and_a_role_on_the_mesh_prefix(
    tmp_path: Path, watch: str
) -> None:
    password = tmp_path / "etcd-password"
    password.write_text("s3cret-Pa55\n")
    password.chmod(0o600)
    wrong = tmp_path / "wrong-password"
    wrong.write_text("guess\n")
    with trio.fail_after(150):
        async with open_lab(2) as lab:
            mesh = MeshLab.create(lab)
            mesh_prefix = members_prefix(mesh.spec).removesuffix("members/")
            await enable_auth(lab, mesh_prefix)
            flags = ["--etcd-user", "vnetd", "--etcd-password-file", str(password)]
            env = {"VNETD_ETCD_USER": "vnetd", "VNETD_ETCD_PASSWORD": "s3cret-Pa55"}
            await join_two(mesh, [*flags, "--etcd-watch", watch], [],
                           {**env, "VNETD_ETCD_WATCH": watch})  # fmt: skip
            assert await mesh.registered_ranks() == {0, 1}
            for daemon in mesh.daemons.values():  # the watch took the token: never refused
                assert "during watch" not in daemon.log_text()

            code, err = await status_in_pod(mesh, *flags)
            assert code == 0, err
            assert_one_line(*await status_in_pod(mesh, "--etcd-user", "vnetd",
                                                 "--etcd-password-file", str(wrong)),
                            "authentication failed for user 'vnetd'")  # fmt: skip
            assert_one_line(*await status_in_pod(mesh, env={"VNETD_ETCD_USER": "outsider",
                                                            "VNETD_ETCD_PASSWORD": "outsider-pw"}),
                            "permission denied for user outsider", mesh_prefix)  # fmt: skip
            assert_one_line(*await status_in_pod(mesh), "requires authentication", "--etcd-user")
            for daemon in mesh.daemons.values():
                assert "s3cret-Pa55" not in daemon.log_text()
                # The lab's etcd is plain http: the daemon says its password crosses in clear.
                assert "etcd user vnetd: its password goes over plain http to http://" in (
                    daemon.log_text()
                )
