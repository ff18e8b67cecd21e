"""Run a rendered pod template's containers in the netns lab, as the kubelet would.

A pod is a lab pod (its network namespace) plus a "sandbox" process whose
mount and UTS namespaces the containers join (``Lab.start(beside=...)``):
every volume of the template becomes a directory (ConfigMap items, Secret
keys with ``defaultMode``, ``emptyDir`` as 0777, ``hostPath`` directories
per node, the node's own under ``/dev``) bind-mounted at each ``mountPath``
(read-only where asked; a ``subPath`` mount binds one file of it), over
private overlays of ``/etc`` and ``/var/lib`` so the mount points can exist.
Each container runs its exact ``command``/``args`` (the image's ENTRYPOINT
when there is no ``command``) after Kubernetes' ``$(VAR)`` expansion, with
the env the manifest gives it (``fieldRef`` resolved), under ``setpriv`` as
its user (``runAsUser``, else the image's user), with its capabilities as
the bounding set and ``no_new_privs`` when privilege escalation is off; a
``privileged`` container runs as root with every capability. A pod's
``fsGroup`` owns its Secret and ConfigMap files, and is its containers' one
supplementary group, as the kubelet does it. A ``csi`` volume of cert-manager's
csi-driver (``csi.cert-manager.io``) is what the driver would write on the node
(``csi_driver_files``: an Ed25519 key made for the pod, a certificate from the
test's CA with the URI SAN templated from the pod, both 0440), and only with
``csi.readOnly: true``, without which the driver refuses the volume.

Not emulated: seccomp, the container's own root filesystem (one mount
namespace per pod), resource limits, probes (callers wait themselves).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from vnetd.control.proof import Signer
from vnetd.lab.open_lab import ETCD_IP, Lab, LabProcess, Pod
from vnetd.render.pods import FLUX_IMAGE

Obj = dict[str, Any]

IMAGE_ENTRYPOINTS = {"vnetd": ["vnetd"]}
"""Image name (without registry and tag) -> ENTRYPOINT (the Dockerfile's)."""
IMAGE_USERS = {FLUX_IMAGE: 1000, "vnetd": 10001}
"""The image's USER: flux-sched's release images name a non-root user (emulated as 1000)."""
SERVICE_HOSTS = {"etcd-client": ETCD_IP}
"""Cluster DNS names the containers resolve: the lab's etcd stands for the Service."""
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command, args and env values."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(one, value)


CSI_DRIVER = "csi.cert-manager.io"
_POD_VARS = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def csi_driver_files(attributes: Mapping[str, str], pod: Mapping[str, str], ca: Signer,
                     *, days: float = 1.0) -> dict[str, bytes]:  # fmt: skip
    """``tls.key`` and ``tls.crt`` as cert-manager's csi-driver writes them for a pod whose
    ``POD_NAME``, ``POD_NAMESPACE``, ``POD_UID`` and ``SERVICE_ACCOUNT_NAME`` are ``pod``:
    the attributes' URI SANs expanded as Go's ``os.Expand`` (another variable is an
    error), an Ed25519 key (PKCS8 PEM), no subject, signed by ``ca``."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
    from cryptography.x509.oid import NameOID

    assert attributes[f"{CSI_DRIVER}/key-algorithm"] == "Ed25519", attributes

    def one(match: re.Match[str]) -> str:
        return pod[match.group(1) or match.group(2)]  # KeyError: the driver refuses it too

    uris = [_POD_VARS.sub(one, uri.strip())
            for uri in attributes[f"{CSI_DRIVER}/uri-sans"].split(",")]  # fmt: skip
    key = Ed25519PrivateKey.generate()
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab rank CA")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
            critical=True,
        )  # fmt: skip
        .sign(ca.private_key, None)
    )
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return {"tls.key": pem, "tls.crt": cert.public_bytes(Encoding.PEM)}


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]


@dataclass
class KubePod:
    """One rendered pod running in a lab pod."""

    lab: Lab
    pod: Pod
    spec: Obj
    sandbox: LabProcess
    fields: dict[str, str]
    """Downward API values: ``status.podIP``, ``metadata.name``, ``spec.nodeName``."""
    extra_env: dict[str, str]
    """What the controller adds to every container (``JOB_COMPLETION_INDEX``) and PATH."""
    overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    """Container name -> env values a user patched in."""
    running: dict[str, LabProcess] = field(default_factory=dict)

    def container(self, name: str) -> Obj:
        found = [c for c in self.spec.get("initContainers", []) + self.spec["containers"]
                 if c["name"] == name]  # fmt: skip
        assert len(found) == 1, name
        return found[0]

    def env_of(self, container: Obj) -> dict[str, str]:
        env = dict(self.extra_env)
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = expand(entry["value"], env)
            else:
                env[entry["name"]] = self.fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        env.update(self.overrides.get(container["name"], {}))
        return env

    def argv_of(self, container: Obj, env: Mapping[str, str]) -> list[str]:
        command = container.get("command") or IMAGE_ENTRYPOINTS[image_name(container["image"])]
        words = [expand(w, env) for w in [*command, *container.get("args", [])]]
        return [*self.privileges(container), *words]

    def privileges(self, container: Obj) -> list[str]:
        security = container.get("securityContext", {})
        if security.get("privileged"):
            assert security.get("runAsUser") == 0, f"{container['name']}: privileged as root"
            return []  # every capability, and /proc/sys writable: nothing to restrict
        uid = security.get("runAsUser", IMAGE_USERS.get(container["image"]))
        if uid is None:
            uid = IMAGE_USERS[image_name(container["image"])]
        caps = security.get("capabilities", {})
        assert caps.get("drop") == ["ALL"], f"{container['name']}: drops every capability"
        bounding = ",".join(["-all", *(f"+{c.lower()}" for c in caps.get("add", []))])
        argv = ["setpriv", f"--bounding-set={bounding}"]
        if uid != 0:
            group = self.spec.get("securityContext", {}).get("fsGroup")
            groups = "--clear-groups" if group is None else f"--groups={group}"
            argv += [f"--reuid={uid}", f"--regid={uid}", groups]
        if security.get("allowPrivilegeEscalation") is False:
            argv.append("--no-new-privs")
        return [*argv, "--"]

    async def run_to_end(
        self, name: str, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[bytes]:  # noqa: ASYNC109
        """An init container: run it in the pod and return its result."""
        container = self.container(name)
        env = self.env_of(container)
        argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *self.argv_of(container, env)]
        return await self.lab.run(self.pod, argv, timeout, beside=self.sandbox)

    async def start(self, name: str) -> LabProcess:
        """A sidecar or main container: start it in the pod."""
        container = self.container(name)
        env = self.env_of(container)
        argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *self.argv_of(container, env)]
        process = await self.lab.start(self.pod, argv, beside=self.sandbox)
        self.running[name] = process
        return process


def materialize_volumes(
    spec: Obj,
    root: Path,
    config_maps: Mapping[str, Obj],
    secrets: Mapping[str, Mapping[str, bytes]],
    csi: Mapping[str, Mapping[str, bytes]] | None = None,
) -> dict[str, Path | None]:
    """A directory per volume of the pod (None: a host device already in place);
    ``csi``: volume name -> the files its driver writes (``csi_driver_files``)."""
    sources: dict[str, Path | None] = {}
    group = spec.get("securityContext", {}).get("fsGroup", -1)
    for volume in spec.get("volumes", []):
        name = volume["name"]
        target = root / "volumes" / name
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            if volume["hostPath"].get("type") == "CharDevice" or path.startswith("/dev/"):
                assert os.path.exists(path), path  # the node's own device (directory)
                sources[name] = None
                continue
            target = root / "host" / path.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]["data"]
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (target / item["path"]).write_text(data[item["key"]])
                (target / item["path"]).chmod(volume["configMap"].get("defaultMode", 0o644))
                os.chown(target / item["path"], -1, group)
        elif "secret" in volume:
            data = secrets[volume["secret"]["secretName"]]
            for key, value in data.items():
                (target / key).write_bytes(value)
                (target / key).chmod(volume["secret"].get("defaultMode", 0o644))
                os.chown(target / key, -1, group)
        elif "csi" in volume:
            assert volume["csi"]["driver"] == CSI_DRIVER, volume
            assert volume["csi"].get("readOnly") is True, f"{name}: the driver refuses it"
            for file, value in (csi or {})[name].items():
                (target / file).write_bytes(value)
                (target / file).chmod(0o440)  # csi-lib's mode, owner root
        elif "emptyDir" in volume:
            target.chmod(0o777)
        sources[name] = target
    return sources


def mount_script(
    spec: Obj,
    sources: Mapping[str, Path | None],
    work: Path,
    hosts: Mapping[str, str] | None = None,
) -> str:
    """Shell run in the sandbox's mount namespace: overlays, then every volumeMount;
    ``hosts``: Service names the pod resolves besides ``SERVICE_HOSTS``."""
    lines = ["set -e"]
    for top in ("etc", "var/lib"):
        upper, lower = (
            work / f"{top.replace('/', '-')}-upper",
            work / f"{top.replace('/', '-')}-work",
        )
        upper.mkdir(parents=True, exist_ok=True)
        lower.mkdir(parents=True, exist_ok=True)
        lines.append(
            f"mount -t overlay overlay -o lowerdir=/{top},upperdir={upper},workdir={lower} /{top}"
        )
    for host, address in {**SERVICE_HOSTS, **(hosts or {})}.items():
        lines.append(f"echo {shlex.quote(f'{address} {host}')} >> /etc/hosts")
    mounted: dict[str, str] = {}
    containers = spec.get("initContainers", []) + spec["containers"]
    for mount in (m for c in containers for m in c.get("volumeMounts", [])):
        path, name = mount["mountPath"], mount["name"]
        if path in mounted:
            assert mounted[path] == name, f"{path}: two volumes"
            continue
        mounted[path] = name
        source = sources[name]
        if source is None:
            continue
        if "subPath" in mount:  # one file of the volume, bound over a file
            source = source / mount["subPath"]
            target = shlex.quote(path)
            lines += [f"mkdir -p $(dirname {target})", f"touch {target}"]
        else:
            lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}")
        if mount.get("readOnly"):
            lines.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
    return "\n".join(lines) + "\n"


async def start_pod(
    lab: Lab,
    pod: Pod,
    spec: Obj,
    *,
    hostname: str,
    fields: dict[str, str],
    extra_env: dict[str, str],
    config_maps: Mapping[str, Obj],
    secrets: Mapping[str, Mapping[str, bytes]],
    overrides: dict[str, dict[str, str]] | None = None,
    csi: Mapping[str, Mapping[str, bytes]] | None = None,
    hosts: Mapping[str, str] | None = None,
) -> KubePod:
    """The pod's sandbox with its volumes mounted; no container started yet (``hosts``:
    Service names it resolves besides etcd's, to addresses)."""
    root = pod.dir / "kube"
    sources = materialize_volumes(spec, root, config_maps, secrets, csi)
    sandbox = await lab.start(pod, ["sleep", "3600"], hostname=hostname)
    # Its namespaces are final once the wrapper (ip netns exec, unshare, sh) has
    # exec'd sleep; mounts made before that would land in a namespace it leaves.
    comm = trio.Path(f"/proc/{sandbox.pid}/comm")
    with trio.fail_after(10):
        while (await comm.read_text()).strip() != "sleep":
            await trio.sleep(0.02)
    script = mount_script(spec, sources, root / "overlay", hosts)
    result = await lab.run(pod, ["sh", "-c", script], 20, beside=sandbox)
    assert result.returncode == 0, result.stderr.decode()
    return KubePod(lab, pod, spec, sandbox, fields, extra_env, overrides or {})


def by_kind(docs: Sequence[Obj]) -> dict[str, list[Obj]]:
    found: dict[str, list[Obj]] = {}
    for doc in docs:
        found.setdefault(doc["kind"], []).append(doc)
    return found


@contextmanager
def shim_directory(prefix: str, extra: Mapping[str, Path] | None = None) -> Iterator[Path]:
    """A directory for PATH holding ``vnetd`` (this checkout) and ``extra`` (name ->
    file copied in), all readable and runnable by any user; removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    root = Path(__file__).parents[2]
    try:
        directory.chmod(0o755)
        vnetd = directory / "vnetd"
        python, path = shlex.quote(sys.executable), shlex.quote(str(root))
        packages = shlex.quote(f"{root}:{sysconfig.get_paths()['purelib']}")
        # A container of a non-root user (the provisioning Jobs) may not reach this
        # interpreter (pyenv under /root, mode 0700): it gets the system's python3 of
        # the same minor version, with this interpreter's packages.
        vnetd.write_text(
            f"#!/bin/sh\nif [ -x {python} ]; then\n"
            f'  PYTHONPATH={path} exec {python} -m vnetd "$@"\nfi\n'
            f'PYTHONPATH={packages} exec /usr/bin/python3 -m vnetd "$@"\n'
        )
        for name, source in (extra or {}).items():
            shutil.copy(source, directory / name)
        for path in directory.iterdir():
            path.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
