"""Every container command the manifests give runs in the lab, as the kubelet would run it.

The pods of ``manifests/sidecar/vnetd.yaml`` (the Indexed Job) and
``manifests/daemonset/vnetd.yaml`` run in lab pods (``kube_pods``): their
volumes mounted from the ConfigMap and Secrets, the exact ``command`` and
``args`` after ``$(VAR)`` expansion, each container's user and capabilities.
etcd serves TLS with ``--client-cert-auth`` from certificates made by the
documented ``openssl`` commands, and answers as ``etcd-client``; its auth is
turned on as shipped: the Job ``etcd-auth`` (manifests/etcd/auth-job.yaml) and
then the mesh's provisioning Job (``provision.yaml`` beside ``vnetd.yaml``) run
to their end, each in a pod of its own, with the documented passwords as their
Secrets, before the mesh's pods start with the user the Job made. Flux is not
installed: ``flux`` is ``flux_stub.py``, which checks what ``flux broker``
would read (config, a 0400 certificate of its own user, the bind address up)
and says so. So a manifest that would fail at start fails here.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml
from kube_pods import KubePod, by_kind, shim_directory, start_pod

from vnetd.lab.etcd import EtcdTls
from vnetd.lab.open_lab import Lab, open_lab

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CURVE_CERT = b"# a CURVE certificate as flux keygen writes one (not parsed by the stub)\n"
START_TIMEOUT = 90.0


@pytest.fixture
def shims() -> Iterator[Path]:
    """``vnetd`` (this checkout) and ``flux`` (the stub) on PATH, readable by any user."""
    with shim_directory("vnetd-kube-shims-", {"flux": HERE / "flux_stub.py"}) as directory:
        yield directory


def documented_certificates(directory: Path) -> dict[str, bytes]:
    """Run docs/kubernetes.md's openssl commands ("etcd over TLS by hand", and the
    passwords of "etcd with auth on") in ``directory``."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    commands = [line for b in blocks for line in b.splitlines() if line.startswith("openssl ")]
    assert len([c for c in commands if not c.startswith("openssl rand ")]) == 10
    for command in commands:
        result = subprocess.run(
            shlex.split(command), cwd=directory, capture_output=True, timeout=60
        )
        assert result.returncode == 0, result.stderr.decode()
    return {name: (directory / name).read_bytes() for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key", "root.pw",
             "vnetd-flux-sample", "relay.crt", "relay.key")}  # fmt: skip


class EtcdTlsByName(EtcdTls):
    """The lab's own etcdctl reaches etcd by address, which the documented server
    certificate does not name (it names etcd-client, as vnetd connects here): the lab's
    readiness check skips the name check; vnetd's connections verify it."""

    def etcdctl_flags(self) -> list[str]:
        return [*super().etcdctl_flags(), "--insecure-skip-tls-verify"]


async def start_tls_etcd(lab: Lab, directory: Path) -> dict[str, dict[str, bytes]]:
    """etcd as manifests/etcd runs it (TLS, client certificates required); the Secrets."""
    files = documented_certificates(directory)
    tls = EtcdTlsByName(
        directory / "ca.crt", directory / "server.crt", directory / "server.key",
        client_cert_auth=True, client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )  # fmt: skip
    await lab.start_etcd(tls=tls)
    client = {"ca.crt": files["ca.crt"], "tls.crt": files["client.crt"],
              "tls.key": files["client.key"]}  # fmt: skip
    mesh_users = {"vnetd-flux-sample": files["vnetd-flux-sample"], "vnetd-hpc-nodes": b"hpc-pw\n"}
    # The relays' own certificate, made by the same document ("Relays"), as its
    # `kubectl create secret tls` stores it.
    relay = {"tls.crt": files["relay.crt"], "tls.key": files["relay.key"]}
    return {"vnetd-etcd-client-tls": client, "etcd-root": {"password": files["root.pw"]},
            "vnetd-etcd-password": mesh_users, "flux-sample-relay-tls": relay}  # fmt: skip


def job_pod(path: Path) -> dict:
    """The pod template of the Job in ``path``."""
    return job_pod_of(path.read_text())


def job_pod_of(text: str) -> dict:
    """The pod template of the Job in a YAML stream."""
    (job,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "Job"]
    return job["spec"]["template"]["spec"]


async def run_auth_jobs(
    lab: Lab, pods: list, shims: Path, mesh_job: dict, config_maps: dict, secrets: dict
) -> list[str]:
    """etcd-auth, then the mesh's provisioning Job (``mesh_job``: its pod template), each
    to its end in a pod of its own (their output); etcd answers with auth on afterwards,
    and the lab's etcdctl logs in as root."""
    outputs = []
    jobs = {"etcd-auth": job_pod(ROOT / "manifests" / "etcd" / "auth-job.yaml"), "mesh": mesh_job}
    for pod, (name, spec) in zip(pods, jobs.items(), strict=True):
        kube = await start_pod(
            lab, pod, spec, hostname=name, fields={}, extra_env={"PATH": f"{shims}:{PATH}"},
            config_maps=config_maps, secrets=secrets,
        )  # fmt: skip
        result = await kube.run_to_end("provision", 90)
        output = result.stdout.decode() + result.stderr.decode()
        assert result.returncode == 0, f"{name}: {output}"
        print(f"Job {name}:\n{output}")
        outputs.append(result.stdout.decode())
    root = secrets["etcd-root"]["password"].decode().strip()
    lab.etcdctl_flags += ["--user", f"root:{root}"]  # the lab's own etcdctl, from now on
    return outputs


def provision_job(base: str) -> dict:
    return job_pod(ROOT / "manifests" / base / "provision.yaml")


def rendered(base: str) -> dict[str, list[dict]]:
    return by_kind(list(yaml.safe_load_all((ROOT / "manifests" / base / "vnetd.yaml").read_text())))


async def wait_exit(process, timeout: float) -> int:  # noqa: ASYNC109
    with trio.move_on_after(timeout):
        return await process.wait(timeout)
    pytest.fail(
        f"{process.argv[-1]!r} still runs after {timeout:g} s:\n{process.log_text()[-3000:]}"
    )


async def wait_for_every_rank(kube: KubePod, shims: Path) -> None:
    """The walk-through's gate, as ``kubectl exec ... -c vnetd -- vnetd wait ...`` runs it."""
    gate = await kube.lab.run(
        kube.pod,
        ["env", "-i", f"PATH={shims}:{PATH}", *kube.privileges(kube.container("vnetd")),
         "vnetd", "wait", "--config", "/etc/vnetd/mesh.toml", "--ranks", "all",
         "--timeout", "60"],
        90, beside=kube.sandbox,
    )  # fmt: skip
    assert gate.returncode == 0, gate.stdout.decode() + gate.stderr.decode()


async def test_job_pods_start_as_the_manifests_say(shims: Path, tmp_path: Path):
    """Cert copy, vnetd sidecar and the Flux container's script, in 4 pods of the Job."""
    objects = rendered("sidecar")
    (job,) = objects["Job"]
    spec = job["spec"]["template"]["spec"]
    config_maps = {c["metadata"]["name"]: c for c in objects["ConfigMap"]}
    name, size = job["metadata"]["name"], job["spec"]["completions"]
    with trio.fail_after(240):
        async with open_lab(size + 2, with_etcd=False) as lab:
            secrets = await start_tls_etcd(lab, tmp_path)
            secrets[f"{name}-curve-cert"] = {"curve.cert": CURVE_CERT}
            auth, mesh_user = await run_auth_jobs(lab, lab.pods[size:], shims,
                                                  provision_job("sidecar"), config_maps, secrets)  # fmt: skip
            assert auth.splitlines() == ["user root: created", "user root: granted role root",
                                         "auth: enabled"]  # fmt: skip
            assert "user vnetd-flux-sample: created (mesh)" in mesh_user.splitlines()
            assert "auth: enabled" not in mesh_user, "auth was on: the user is made as root"
            pods: list[KubePod] = []
            for index, pod in enumerate(lab.pods[:size]):
                pods.append(await start_pod(
                    lab, pod, spec, hostname=f"{name}-{index}",
                    fields={"status.podIP": pod.underlay_ip,
                            "metadata.name": f"{name}-{index}-x{index}"},
                    extra_env={"PATH": f"{shims}:{PATH}", "JOB_COMPLETION_INDEX": str(index)},
                    config_maps=config_maps, secrets=secrets,
                ))  # fmt: skip
            flux = {}
            for index, kube in enumerate(pods):
                # Init containers in order: the certificate copy runs to its end ...
                copied = await kube.run_to_end("flux-curve-cert")
                assert copied.returncode == 0, copied.stderr.decode()
                # ... vnetd is a sidecar; the Flux container starts at once here (the
                # startup probe is not emulated), so its own /readyz wait is exercised.
                await kube.start("vnetd")
                flux[index] = await kube.start("flux")
            for index, process in flux.items():
                code = await wait_exit(process, START_TIMEOUT)
                log = process.log_text()
                print(log.strip().splitlines()[-1])
                assert code == 0, log
                assert "vnetd ready: the overlay address is up" in log
                assert f"flux stub: broker rank {index} of {size} would start" in log
                assert "mode 0400, uid 1000" in log
            for kube in pods:
                daemon = kube.running["vnetd"].log_text()
                assert kube.running["vnetd"].returncode is None, daemon
                assert "mtu auto:" in daemon and "Traceback" not in daemon
            await wait_for_every_rank(pods[0], shims)


async def test_daemonset_pods_start_and_take_the_underlay_interface(shims: Path, tmp_path: Path):
    """Two nodes of the DaemonSet: VNETD_UNDERLAY_INTERFACE picks eth0's address over a
    wrong POD_IP, --rank auto assigns ranks, the nodes reach each other; an interface
    that does not exist stops the container with one line (exit 2)."""
    objects = rendered("daemonset")
    (daemonset,) = objects["DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    config_maps = {c["metadata"]["name"]: c for c in objects["ConfigMap"]}
    with trio.fail_after(180):
        async with open_lab(5, with_etcd=False) as lab:
            secrets = await start_tls_etcd(lab, tmp_path)
            _, mesh_user = await run_auth_jobs(lab, lab.pods[3:], shims,
                                               provision_job("daemonset"), config_maps, secrets)  # fmt: skip
            assert "user vnetd-hpc-nodes: created (mesh)" in mesh_user.splitlines()
            nodes: list[KubePod] = []
            for index, pod in enumerate(lab.pods[:3]):
                underlay = "eth0" if index < 2 else "ib0"
                nodes.append(await start_pod(
                    lab, pod, spec, hostname=f"node-{index}",
                    fields={"status.podIP": "198.18.255.250", "metadata.name": f"vnetd-{index}",
                            "spec.nodeName": f"node-{index}"},
                    extra_env={"PATH": f"{shims}:{PATH}"},
                    config_maps=config_maps, secrets=secrets,
                    overrides={"vnetd": {"VNETD_UNDERLAY_INTERFACE": underlay}},
                ))  # fmt: skip
            for kube in nodes:
                await kube.start("vnetd")
            missing = nodes[2].running["vnetd"]
            assert await wait_exit(missing, 30) == 2
            assert "VNETD_UNDERLAY_INTERFACE: ib0 has no global address" in missing.log_text()
            # --rank auto: which node gets which rank is a race; each pings both addresses.
            with trio.fail_after(60):
                for index in (0, 1):
                    for address in ("10.251.0.1", "10.251.0.2"):
                        argv = ["ping", "-c1", "-W1", address]
                        while (await lab.run(nodes[index].pod, argv)).returncode:
                            await trio.sleep(0.2)
            for index in (0, 1):
                log = nodes[index].running["vnetd"].log_text()
                assert f"underlay: eth0 {lab.pods[index].underlay_ip}" in log, log
                assert f"endpoint {lab.pods[index].underlay_ip}:51830" in log, log
                assert "198.18.255.250" not in log.split("underlay:", 1)[1]


async def test_the_old_layout_fails_at_start(shims: Path, tmp_path: Path):
    """The Secret mounted straight at the certificate's directory (0400, root-owned), as the
    manifests had it before the copy: the broker's user cannot read it, and this fails."""
    objects = rendered("sidecar")
    (job,) = objects["Job"]
    spec = copy.deepcopy(job["spec"]["template"]["spec"])
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] == "vnetd"]
    (flux,) = spec["containers"]
    for mount in flux["volumeMounts"]:
        if mount["name"] == "flux-curve-cert":
            mount["name"] = "flux-curve-secret"
    for volume in spec["volumes"]:
        if volume["name"] == "flux-curve-secret":
            volume["secret"]["defaultMode"] = 0o400
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "flux-curve-cert"]
    config_maps = {c["metadata"]["name"]: c for c in objects["ConfigMap"]}
    name = job["metadata"]["name"]
    with trio.fail_after(120):
        async with open_lab(3, with_etcd=False) as lab:
            secrets = await start_tls_etcd(lab, tmp_path)
            secrets[f"{name}-curve-cert"] = {"curve.cert": CURVE_CERT}
            await run_auth_jobs(
                lab, lab.pods[1:], shims, provision_job("sidecar"), config_maps, secrets
            )
            pod = lab.pods[0]
            kube = await start_pod(
                lab, pod, spec, hostname=f"{name}-0",
                fields={"status.podIP": pod.underlay_ip, "metadata.name": f"{name}-0-x"},
                extra_env={"PATH": f"{shims}:{PATH}", "JOB_COMPLETION_INDEX": "0"},
                config_maps=config_maps, secrets=secrets,
            )  # fmt: skip
            await kube.start("vnetd")
            process = await kube.start("flux")
            assert await wait_exit(process, START_TIMEOUT) == 1
            log = process.log_text()
            assert "vnetd ready" in log
            assert "flux stub: curve_cert /etc/flux/system/curve.cert: Permission denied" in log


@pytest.mark.parametrize(
    ("owner", "mode", "message"),
    [
        pytest.param(1000, 0o400, "broker rank 0 of 1 would start", id="own-0400"),
        pytest.param(0, 0o400, "Permission denied", id="root-0400"),
        pytest.param(1000, 0o440, "readable by group/other (mode 0440)", id="own-0440"),
    ],
)
def test_flux_stub_checks_the_certificate_as_flux_core_does(
    shims: Path, owner: int, mode: int, message: str
):
    """The stub's checks can fail: flux-core's rule for the CURVE certificate."""
    directory = Path(tempfile.mkdtemp(prefix="vnetd-flux-stub-"))
    try:
        directory.chmod(0o755)
        cert = directory / "curve.cert"
        cert.write_bytes(CURVE_CERT)
        os.chown(cert, owner, owner)
        cert.chmod(mode)
        (directory / "bootstrap.toml").write_text(
            f'[bootstrap]\ncurve_cert = "{cert}"\nhosts = [\n'
            f'  {{ host = "{socket.gethostname()}", bind = "tcp://127.0.0.1:8050" }},\n]\n'
        )
        result = subprocess.run(
            ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "--",
             str(shims / "flux"), "broker", f"--config-path={directory}"],
            capture_output=True, text=True, timeout=30, env={"PATH": PATH},
        )  # fmt: skip
        assert message in result.stdout + result.stderr, result
        assert result.returncode == (0 if "would start" in message else 1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_job_pods_run_with_their_own_rank_certificates(shims: Path, tmp_path: Path):
    """The sidecar manifests rendered from manifests/sidecar/mesh.toml with ``rank_ca``
    pinned: each pod's csi-driver volume holds a certificate issued for its own pod name
    (``<job>-<index>-xxxxx``) by the pinned CA, vnetd signs with that key and carries the
    certificate, and every reader takes every rank (``vnetd wait --ranks all``); a pod of
    index 3 whose volume holds a certificate for index 2's pod name exits 2 naming it."""
    from kube_pods import csi_driver_files

    from vnetd.control.proof import Signer
    from vnetd.render.manifests import render_manifests
    from vnetd.render.rank_certs import VOLUME
    from vnetd.spec import load_spec

    ca = Signer.generate()
    source = (ROOT / "manifests" / "sidecar" / "mesh.toml").read_text()
    text = source.replace('hostname = "{name}-{rank}"',
                          f'hostname = "{{name}}-{{rank}}"\nrank_ca = ["{ca.public_key}"]', 1)  # fmt: skip
    (tmp_path / "mesh.toml").write_text(text)
    objects = by_kind(list(yaml.safe_load_all(
        render_manifests(load_spec(tmp_path / "mesh.toml"), text))))  # fmt: skip
    (job,) = objects["Job"]
    spec = job["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == VOLUME]
    attributes = volume["csi"]["volumeAttributes"]
    config_maps = {c["metadata"]["name"]: c for c in objects["ConfigMap"]}
    name, size = job["metadata"]["name"], job["spec"]["completions"]

    def issued(pod_name: str) -> dict[str, dict[str, bytes]]:
        pod = {"POD_NAME": pod_name, "POD_NAMESPACE": "hpc", "POD_UID": f"uid-{pod_name}",
               "SERVICE_ACCOUNT_NAME": "default"}  # fmt: skip
        return {VOLUME: csi_driver_files(attributes, pod, ca)}

    with trio.fail_after(240):
        async with open_lab(size + 3, with_etcd=False) as lab:
            secrets = await start_tls_etcd(lab, tmp_path)
            secrets[f"{name}-curve-cert"] = {"curve.cert": CURVE_CERT}
            await run_auth_jobs(lab, lab.pods[size : size + 2], shims, provision_job("sidecar"),
                                config_maps, secrets)  # fmt: skip
            env = {"PATH": f"{shims}:{PATH}"}
            pods: list[KubePod] = []
            for index, pod in enumerate(lab.pods[:size]):
                pod_name = f"{name}-{index}-ab12{index}"
                pods.append(await start_pod(
                    lab, pod, spec, hostname=f"{name}-{index}",
                    fields={"status.podIP": pod.underlay_ip, "metadata.name": pod_name},
                    extra_env={**env, "JOB_COMPLETION_INDEX": str(index)},
                    config_maps=config_maps, secrets=secrets, csi=issued(pod_name),
                ))  # fmt: skip
            for kube in pods:
                await kube.run_to_end("flux-curve-cert")
                await kube.start("vnetd")
            await wait_for_every_rank(pods[0], shims)
            for kube in pods:
                daemon = kube.running["vnetd"].log_text()
                assert kube.running["vnetd"].returncode is None, daemon
                assert "Traceback" not in daemon and "bad entr" not in daemon, daemon
            wrong = await start_pod(
                lab, lab.pods[size + 2], spec, hostname=f"{name}-3",
                fields={"status.podIP": lab.pods[size + 2].underlay_ip,
                        "metadata.name": f"{name}-3-zz999"},
                extra_env={**env, "JOB_COMPLETION_INDEX": "3"},
                config_maps=config_maps, secrets=secrets, csi=issued(f"{name}-2-zz999"),
            )  # fmt: skip
            process = await wrong.start("vnetd")
            assert await wait_exit(process, 60) == 2
            log = process.log_text()
            print(log.strip().splitlines()[-1])
            assert f"field cert names pod hpc/{name}-2-zz999, not rank 3" in log, log
