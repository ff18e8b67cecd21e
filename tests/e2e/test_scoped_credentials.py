"""Credentials scoped by ``vnetd provision``, against real etcd 3.4 with auth and
client certificates on (docs/security.md, "Scoped credentials").

One lab of three pods, etcd over TLS with ``--client-cert-auth`` and auth enabled. A
rank user runs its rank's daemon; with that credential an attacker (``etcd_as.py``,
in the rank's pod) cannot write, delete or lease-bind another rank's entry, nor
revoke its lease; a daemon started at another rank with it never registers; a site
user cannot claim the other site's ranks; a mesh user cannot read or write another
mesh, make users or roles, or turn auth off. Each refusal is checked as etcd answers it (HTTP 403, gRPC code 7), and what
etcd 3.4 does *not* refuse (keeping another's lease alive) is asserted as found.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
from bounds import form
from tlscerts import CertFiles, TestCA

from vnetd.control.membership import member_key, mesh_prefix
from vnetd.lab.cluster import MeshLab, write_spec
from vnetd.lab.etcd import EtcdTls
from vnetd.lab.open_lab import ETCD_IP, Lab, Pod, open_lab
from vnetd.spec import load_spec

HERE = Path(__file__).parent
PERMISSION_DENIED = 7
REFUSAL_WAIT = 20.0
"""How long a daemon at a rank its credential may not write is given to show it (its
claim is refused at once; the bound only absorbs a slow start on shared cores)."""


async def vnetd_in(lab: Lab, pod: Pod, *args: str) -> tuple[int, str, str]:
    result = await lab.run(pod, [sys.executable, "-m", "vnetd", *args], 60)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def as_user(
    lab: Lab, pod: Pod, tls: list[str], user: str, password: Path | None, *ops: list[object]
) -> list[dict[str, object]]:
    """Run ``ops`` against etcd from ``pod`` as ``user`` (``etcd_as.py``)."""
    argv = [sys.executable, str(HERE / "etcd_as.py"), lab.etcd_url, *tls, user,
            str(password or "-"), json.dumps(list(ops))]  # fmt: skip
    result = await lab.run(pod, argv, 30)
    assert result.returncode == 0, result.stderr.decode()
    answers: list[dict[str, object]] = json.loads(result.stdout)
    return answers


def denied(answer: dict[str, object]) -> bool:
    return answer["status"] == 403 and answer["code"] == PERMISSION_DENIED


async def lease_of(lab: Lab, key: str) -> int:
    result = await lab.etcdctl("get", key, "-w", "json")
    return int(json.loads(result.stdout)["kvs"][0]["lease"])


async def secured_lab(lab: Lab, pki: Path) -> tuple[list[str], CertFiles]:
    """etcd over TLS with client certificates, auth on, root's password root-secret.

    Returns:
        (``etcd_as.py``'s CA, certificate and key for vnetd clients, a CN certificate).
    """
    ca = TestCA(pki)
    server = ca.issue("etcd-server", ips=(ETCD_IP, "127.0.0.1"))
    root = ca.issue("root")
    client = ca.issue("vnetd-client", common_name=False)
    named = ca.issue("lab-2")
    await lab.start_etcd(tls=EtcdTls(ca.ca_file, server.cert, server.key, client_cert_auth=True,
                                     client_cert=root.cert, client_key=root.key))  # fmt: skip
    for args in (("user", "add", "root:root-secret"), ("user", "grant-role", "root", "root"),
                 ("auth", "enable")):  # fmt: skip
        await lab.etcdctl(*args)
    lab.etcdctl_flags += ["--user", "root:root-secret"]
    return [str(ca.ca_file), str(client.cert), str(client.key)], named


def tls_flags(tls: list[str]) -> list[str]:
    return ["--etcd-ca", tls[0], "--etcd-cert", tls[1], "--etcd-key", tls[2]]


async def test_scoped_credentials_refuse_what_their_scope_does_not_cover(tmp_path: Path) -> None:
    root_password = tmp_path / "root.pw"
    root_password.write_text("root-secret\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    with trio.fail_after(240):
        async with open_lab(3, with_etcd=False) as lab:
            tls, named = await secured_lab(lab, tmp_path / "pki")
            mesh = MeshLab.create(lab)
            other_path = write_spec(tmp_path / "other.toml", 3, lab.etcd_urls, name="other")
            admin = ["--etcd-user", "root", "--etcd-password-file", str(root_password),
                     *tls_flags(tls), "--passwords", str(secrets)]  # fmt: skip
            provision = ["provision", "--config", str(mesh.spec_path), *admin,
                         "--rank-users", "all", "--site", "a=0-1", "--site", "b=2"]  # fmt: skip
            code, out, err = await vnetd_in(lab, mesh.pod(0), *provision)
            assert code == 0, err
            print(f"provision:\n{out}")
            assert "user lab-0: created (rank 0)" in out
            code, out, err = await vnetd_in(lab, mesh.pod(0), *provision)
            assert (code, out.strip()) == (0, "nothing to change"), (out, err)
            code, out, err = await vnetd_in(lab, mesh.pod(0), "provision", "--config",
                                            str(other_path), *admin)  # fmt: skip
            assert code == 0, err
            assert {p.name for p in secrets.iterdir()} == {
                "lab-0", "lab-1", "lab-2", "vnetd-lab", "vnetd-lab-site-a", "vnetd-lab-site-b",
                "vnetd-other"}  # fmt: skip
            assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets.iterdir())

            def rank_flags(user: str) -> list[str]:
                return ["--etcd-user", user, "--etcd-password-file", str(secrets / user),
                        *tls_flags(tls)]  # fmt: skip

            await mesh.start_probes()
            await mesh.start_rank(0, *rank_flags("lab-0"))
            await mesh.start_rank(1, *rank_flags("lab-1"))
            await form(mesh, {0, 1}, what="ranks 0 and 1 with their own users")

            # A daemon at rank 2 holding rank 1's credential: its claim is refused.
            intruder = await mesh.start_rank(2, *rank_flags("lab-1"))
            with trio.move_on_after(REFUSAL_WAIT):
                while "permission denied" not in intruder.log_text():
                    await trio.sleep(0.2)
            assert "permission denied for user lab-1" in intruder.log_text()
            assert await mesh.registered_ranks() == {0, 1}
            await intruder.stop()
            del mesh.daemons[2]

            # Rank 1's credential against rank 0's entry and lease.
            key0, key1 = member_key(mesh.spec, 0), member_key(mesh.spec, 1)
            lease0 = await lease_of(lab, key0)
            other_key = member_key(load_spec(other_path), 0)
            put, delete, revoke, bind, foreign, alive, read = await as_user(
                lab, mesh.pod(1), tls, "lab-1", secrets / "lab-1",
                ["put", key0, "{}"], ["delete", key0], ["revoke", lease0],
                ["put_lease", key1, "{}", lease0], ["put", other_key, "{}"],
                ["keepalive", lease0], ["get", key0])  # fmt: skip
            for what, answer in (("put", put), ("delete", delete), ("revoke", revoke),
                                 ("bind to its lease", bind), ("other mesh", foreign)):  # fmt: skip
                assert denied(answer), (what, answer)
            assert read["status"] == 200 and "kvs" in str(read["text"]), read
            # etcd 3.4 does not check LeaseKeepAlive: any user may renew any lease.
            assert alive["status"] == 200 and '"TTL"' in str(alive["text"]), alive
            print(f"etcd 3.4 LeaseKeepAlive of another user's lease: {alive['text'][:120]}")

            # Site users: a may not claim b's rank 2; b may.
            (site_a,) = await as_user(lab, mesh.pod(0), tls, "vnetd-lab-site-a",
                                      secrets / "vnetd-lab-site-a",
                                      ["put", member_key(mesh.spec, 2), "{}"])  # fmt: skip
            assert denied(site_a), site_a
            site_b = await as_user(lab, mesh.pod(2), tls, "vnetd-lab-site-b",
                                   secrets / "vnetd-lab-site-b",
                                   ["put", member_key(mesh.spec, 2), "{}"],
                                   ["put", key0, "{}"], ["delete", member_key(mesh.spec, 2)])  # fmt: skip
            assert [a["status"] for a in site_b] == [200, 403, 200], site_b

            # Mesh users: each reaches only its own mesh.
            other_prefix = mesh_prefix(load_spec(other_path))
            get_other, put_other, own = await as_user(
                lab, mesh.pod(0), tls, "vnetd-lab", secrets / "vnetd-lab",
                ["get", f"{other_prefix}spec"], ["put", f"{other_prefix}members/0", "{}"],
                ["get", f"{mesh_prefix(mesh.spec)}spec"])  # fmt: skip
            assert denied(get_other) and denied(put_other), (get_other, put_other)
            assert own["status"] == 200 and "kvs" in str(own["text"]), own

            # etcd 3.4's gateway ignores a client certificate's CN: with auth on it
            # refuses a request that presents one, so the user must come from a password.
            (cn,) = await as_user(lab, mesh.pod(0), [tls[0], str(named.cert), str(named.key)],
                                  "-", None, ["get", key0])  # fmt: skip
            assert cn["status"] == 400 and "CommonName" in str(cn["text"]), cn
            # Over gRPC (etcdctl) the same certificate is user lab-2: its own key only.
            grpc = ["etcdctl", "--endpoints", lab.etcd_url, "--cacert", tls[0],
                    "--cert", str(named.cert), "--key", str(named.key)]  # fmt: skip
            key2 = member_key(mesh.spec, 2)
            own_put = await lab.run(mesh.pod(0), [*grpc, "put", key2, "{}"])
            other_put = await lab.run(mesh.pod(0), [*grpc, "put", key0, "{}"])
            await lab.run(mesh.pod(0), [*grpc, "del", key2])
            assert own_put.returncode == 0, own_put.stderr
            assert b"permission denied" in other_put.stderr, other_put.stderr

            # The mesh user, every pod's credential where there is one, is no admin: it
            # may not make users or roles, nor turn auth off.
            admin = await as_user(lab, mesh.pod(0), tls, "vnetd-lab", secrets / "vnetd-lab",
                                  ["user_add", "thief", "x"], ["role_add", "thief"],
                                  ["auth_disable"])  # fmt: skip
            assert all(denied(answer) for answer in admin), admin

            # Nothing of this touched the mesh: both ranks still hold and reach each other.
            assert await mesh.registered_ranks() == {0, 1}
            assert await mesh.device_ranks(0) == {1}
            assert await mesh.device_ranks(1) == {0}
            assert not mesh.dead_daemons()
