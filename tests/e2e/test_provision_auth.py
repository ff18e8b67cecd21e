"""``vnetd provision --enable-auth``, the shipped deployment's step that turns etcd's auth
on (docs/kubernetes.md, "etcd with auth on"), against real etcd 3.4 over TLS with
client certificates and auth off, as the manifests' etcd starts.

The command is started before etcd exists (``--wait``, as the Job starts beside
etcd) and finishes once etcd answers: it makes the mesh's user with the password the
operator put in the passwords directory (the Secret the daemons read), then root, then
turns auth on. A daemon started with that user before etcd exists (the deployment's
order not kept) retries through "unreachable" and "authentication is not enabled" or
"failed", and registers once its user exists. Afterwards a request without a user is refused, the mesh user reads and a
daemon holding that user's credential registers; a second run changes nothing, nor
does the Job etcd-auth's form (no spec), and auth stays on. The client certificate
alone (what every pod holds) may not put, delete, revoke, add a user or turn auth
off; whether it may renew a
lease depends on the version (asserted as found for the one running). No wait here guards a failure of its own: each is a command's bound.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import trio
from bounds import form
from test_scoped_credentials import as_user, lease_of, tls_flags
from tlscerts import TestCA

from vnetd.control.membership import member_key, spec_key
from vnetd.lab.cluster import MeshLab
from vnetd.lab.etcd import EtcdTls
from vnetd.lab.open_lab import ETCD_IP, ETCD_PORT, open_lab

INVALID_ARGUMENT = 3
"""etcd's code for "user name is empty": a call naming no user once auth is on."""
ETCD_LATE = 2.0


def lease_renew_checked(version: str) -> bool:
    """Whether etcd refuses a keepalive without a user: from 3.5.28 and 3.4.42 (the fix
    for CVE-2026-33413, docs/security.md); 3.4.23 and 3.5.1 renew anyone's lease."""
    major, minor, patch = (int(part) for part in version.split(".")[:3])
    return (major, minor) > (3, 5) or (minor == 5 and patch >= 28) or (minor == 4 and patch >= 42)


"""How long after the command etcd starts: the command must be waiting by then."""


async def test_provision_enable_auth_waits_for_etcd_makes_users_then_turns_auth_on(
    tmp_path: Path,
) -> None:
    root_password = tmp_path / "root.pw"
    root_password.write_text("root-secret\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "vnetd-lab").write_text("mesh-secret\n")
    (secrets / "vnetd-lab").chmod(0o600)
    ca = TestCA(tmp_path / "pki")
    server = ca.issue("etcd-server", ips=(ETCD_IP, "127.0.0.1"))
    admin = ca.issue("root")
    client = ca.issue("vnetd-client", common_name=False)
    tls = [str(ca.ca_file), str(client.cert), str(client.key)]
    url = f"https://{ETCD_IP}:{ETCD_PORT}"
    with trio.fail_after(240):
        async with open_lab(2, with_etcd=False) as lab:
            mesh = MeshLab.create(lab)
            argv = [sys.executable, "-m", "vnetd", "provision", "--config", str(mesh.spec_path),
                    "--etcd", url, *tls_flags(tls), "--etcd-user", "root",
                    "--etcd-password-file", str(root_password), "--passwords", str(secrets),
                    "--enable-auth", "--wait", "60"]  # fmt: skip
            results = []

            async def provision() -> None:
                results.append(await lab.run(mesh.pod(0), argv, 90))

            user = ["--etcd", url, *tls_flags(tls), "--etcd-user", "vnetd-lab",
                    "--etcd-password-file", str(secrets / "vnetd-lab")]  # fmt: skip
            await mesh.start_probes()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(provision)
                await mesh.start_rank(0, *user)
                await trio.sleep(ETCD_LATE)
                await lab.start_etcd(tls=EtcdTls(ca.ca_file, server.cert, server.key,
                                                 client_cert_auth=True, client_cert=admin.cert,
                                                 client_key=admin.key))  # fmt: skip
            (first,) = results
            out, err = first.stdout.decode(), first.stderr.decode()
            print(f"provision (started {ETCD_LATE:g} s before etcd):\n{out}{err}")
            assert first.returncode == 0, err
            assert "trying again" in err, "it did not wait for etcd"
            lines = out.splitlines()
            assert lines[-3:] == ["user root: created", "user root: granted role root",
                                  "auth: enabled"]  # fmt: skip
            assert "user vnetd-lab: created (mesh)" in lines
            assert f"spec {spec_key(mesh.spec)}: stored" in lines
            assert lab.etcd_url == url
            provisioned = time.monotonic()

            # Auth is on: no user, no answer; the mesh user reads; root's password works.
            (nobody,) = await as_user(lab, mesh.pod(1), tls, "-", None, ["get", "x"])
            assert nobody["code"] == INVALID_ARGUMENT and "user name is empty" in str(
                nobody["text"]
            ), nobody
            (mesh_user,) = await as_user(lab, mesh.pod(1), tls, "vnetd-lab",
                                         secrets / "vnetd-lab", ["get", spec_key(mesh.spec)])  # fmt: skip
            assert mesh_user["status"] == 200 and "kvs" in str(mesh_user["text"]), mesh_user
            lab.etcdctl_flags += ["--user", "root:root-secret"]
            assert b"root" in (await lab.etcdctl("user", "list")).stdout

            # Idempotent: a second run (the Job again) changes nothing and leaves auth on.
            again = await lab.run(mesh.pod(0), argv, 60)
            assert (again.returncode, again.stdout.decode().strip()) == (0, "nothing to change"), (
                again.stdout,
                again.stderr,
            )
            # The Job etcd-auth's form (no spec): auth is on, so nothing to do either.
            etcd_only = [arg for arg in argv if arg not in {"--config", str(mesh.spec_path),
                                                            "--passwords", str(secrets)}]  # fmt: skip
            alone = await lab.run(mesh.pod(0), etcd_only, 60)
            assert (alone.returncode, alone.stdout.decode().strip()) == (0, "nothing to change"), (
                alone.stdout,
                alone.stderr,
            )
            (still,) = await as_user(lab, mesh.pod(1), tls, "-", None, ["get", "x"])
            assert still["code"] == INVALID_ARGUMENT, still

            # The mesh runs on the credential the step made, the early daemon too.
            await mesh.start_rank(1, *user)
            await form(mesh, {0, 1}, what="ranks on the provisioned mesh user",
                       since=provisioned)  # fmt: skip
            # The client certificate alone, as every pod holds it: no write, no revoke.
            key0 = member_key(mesh.spec, 0)
            lease0 = await lease_of(lab, key0)
            status = json.loads((await lab.etcdctl("endpoint", "status", "-w", "json")).stdout)
            version = str(status[0]["Status"]["version"])
            put, delete, revoke, user_add, disable, alive = await as_user(
                lab, mesh.pod(1), tls, "-", None, ["put", key0, "{}"], ["delete", key0],
                ["revoke", lease0], ["user_add", "thief", "x"], ["auth_disable"],
                ["keepalive", lease0])  # fmt: skip
            for what, answer in (("put", put), ("delete", delete), ("revoke", revoke),
                                 ("user add", user_add), ("auth disable", disable)):  # fmt: skip
                assert answer["code"] == INVALID_ARGUMENT, (what, answer)
            renewed = alive["status"] == 200 and '"TTL"' in str(alive["text"])
            assert renewed != lease_renew_checked(version), (version, alive)
            print(f"etcd {version}: the bare client certificate renews a lease: {renewed}")
            early = [line for line in mesh.daemons[0].log_text().splitlines() if "etcd" in line]
            print("rank 0, started before etcd:", *early[-3:], sep="\n")
            assert not mesh.dead_daemons()
