"""The containers and volumes of the pods ``vnetd render manifests`` writes.

* the vnetd container: ``vnetd up`` as UID 0 with only ``NET_ADMIN``, the
  node's ``/dev/net/tun``, probes on ``/readyz`` and ``/healthz``;
* the Flux example: an init container of the Flux image that copies the
  CURVE certificate into a 0400 file of the image's user, and the main
  container, which waits for ``/readyz`` and then execs ``flux broker``
  (``podscripts``).

Pure: dictionaries only. ``docs/kubernetes.md`` explains each setting.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR
from vnetd.errors import SpecError
from vnetd.render.flux import DEFAULT_CURVE_CERT
from vnetd.render.podscripts import (
    CERT_COPY_SCRIPT,
    CURVE_SECRET_DIR,
    UNDERLAY_ENV,
    UNDERLAY_SCRIPT,
    flux_start_script,
)
from vnetd.render.secretfiles import secret_files, with_secret_files
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

FLUX_IMAGE = "fluxrm/flux-sched:jammy-v0.54.0"
"""flux-sched's release image: ``<distribution>-<tag>`` is how its CI tags releases."""

CONFIG_DIR = "/etc/vnetd"
FLUX_CONFIG_DIR = "/etc/flux/config"
STATE_DIR = "/var/lib/vnetd"
VNETD_MOUNTS = (CONFIG_DIR, STATE_DIR, SOCKET_DIR, "/dev")
"""What the vnetd container mounts: no Secret file or TLS directory may go under them."""
TUN_DEVICE = "/dev/net/tun"
SPEC_KEY = "mesh.toml"
BOOTSTRAP_KEY = "bootstrap.toml"
CURVE_CERT_FILE = DEFAULT_CURVE_CERT.rpartition("/")[2]

RUNTIME_DEFAULT_SECCOMP: Obj = {"seccompProfile": {"type": "RuntimeDefault"}}

ETCD_CLIENT_SECRET = "vnetd-etcd-client-tls"
"""The Secret with vnetd's etcd client certificate (components/etcd-cert-manager makes it)."""
ETCD_TLS_FILES = {"ca_file": "ca.crt", "cert_file": "tls.crt", "key_file": "tls.key"}
"""registry.* key -> the file name it must have: the Secret's keys, as cert-manager writes them."""


def config_name(spec: MeshSpec) -> str:
    """The ConfigMap that holds the spec (and the Flux bootstrap table)."""
    return f"{spec.name}-vnetd"


def vnetd_container(spec: MeshSpec, image: str, port: int, identity: list[str]) -> Obj:
    """``vnetd up`` with the spec from the ConfigMap; ``identity`` are the rank flags."""
    listen_host = "[::]" if listens_on_ipv6(spec) else "0.0.0.0"
    # Lazy pairs' first handshakes ring the doorbell (mesh.tree_fanout).
    doorbell = [{"name": "doorbell", "containerPort": spec.doorbell_port, "protocol": "UDP"}]
    if not spec.tree_fanout:
        doorbell = []
    return {
        "name": "vnetd",
        "image": image,
        "args": [
            "up",
            *identity,
            "--state-dir",
            STATE_DIR,
            "--http-listen",
            f"{listen_host}:{port}",
        ],
        "env": [
            field_env("POD_IP", "status.podIP"),
            field_env("POD_NAME", "metadata.name"),
        ],
        "ports": [
            {"name": "wireguard", "containerPort": spec.port, "protocol": "UDP"},
            *doorbell,
            {"name": "vnetd-http", "containerPort": port, "protocol": "TCP"},
        ],
        "startupProbe": _probe("/readyz", period=1, failures=300),
        "readinessProbe": _probe("/readyz", period=10, failures=3),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "resources": resources("50m", "64Mi", "256Mi"),
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
        },
        "volumeMounts": [
            {"name": "vnetd-config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "vnetd-state", "mountPath": STATE_DIR},
            {"name": "wireguard-sock", "mountPath": SOCKET_DIR},
            {"name": "dev-net-tun", "mountPath": TUN_DEVICE},
        ],
    }


def etcd_tls_dir(spec: MeshSpec, taken: tuple[str, ...] = VNETD_MOUNTS) -> str | None:
    """Where the manifests mount ``ETCD_CLIENT_SECRET``: the directory of the spec's
    ``registry.ca_file``, ``cert_file`` and ``key_file``; None when it names none.

    Raises:
        SpecError: a file is not named as the Secret's key, the files are in
            different directories, or that directory is one vnetd mounts already.
    """
    named = {key: getattr(spec.registry, key) for key in ETCD_TLS_FILES}
    paths = {key: PurePosixPath(value) for key, value in named.items() if value}
    if not paths:
        return None
    for key, path in paths.items():
        if path.name != ETCD_TLS_FILES[key] or not path.is_absolute():
            raise SpecError(
                f"registry.{key}: {str(path)!r}: the manifests mount the Secret "
                f"{ETCD_CLIENT_SECRET}, whose keys are ca.crt, tls.crt and tls.key; name it "
                f"/etc/vnetd-etcd/{ETCD_TLS_FILES[key]} (one absolute directory for all three)"
            )
    directories = {str(path.parent) for path in paths.values()}
    directory = directories.pop()
    if directories or any(PurePosixPath(directory).is_relative_to(t) for t in taken):
        key = next(iter(paths))
        raise SpecError(
            f"registry.{key}: put ca_file, cert_file and key_file in one directory of their "
            f"own, such as /etc/vnetd-etcd (not under {', '.join(taken)})"
        )
    return directory


def with_etcd_tls(spec: MeshSpec, container: Obj, volumes: list[Obj]) -> None:
    """Mount the Secrets of the files the spec names: ``ETCD_CLIENT_SECRET`` where its
    TLS files are, the pre-shared key and the etcd password (``secretfiles``).

    Raises:
        SpecError: a file cannot be mounted where the spec names it (naming the key).
    """
    directory = etcd_tls_dir(spec)
    files = secret_files(spec, (*VNETD_MOUNTS, directory) if directory else VNETD_MOUNTS)
    with_secret_files(files, container, volumes)
    if directory is None:
        return
    mount = {"name": "etcd-client-tls", "mountPath": directory, "readOnly": True}
    container["volumeMounts"].append(mount)
    volumes.append(
        {
            "name": "etcd-client-tls",
            "secret": {"secretName": ETCD_CLIENT_SECRET, "defaultMode": 0o400},
        }
    )


def with_underlay_choice(container: Obj) -> Obj:
    """The DaemonSet's vnetd: ``UNDERLAY_SCRIPT`` as the entrypoint, the interface empty."""
    return {
        **container,
        "command": ["/bin/sh", "-c", UNDERLAY_SCRIPT, "vnetd"],
        "env": [*container["env"], {"name": UNDERLAY_ENV, "value": ""}],
    }


def readyz_host(spec: MeshSpec) -> str:
    """The address the pod's other containers reach vnetd's HTTP endpoint at."""
    return "::1" if listens_on_ipv6(spec) else "127.0.0.1"


def broker_argv(spec: MeshSpec) -> list[str]:
    """The example's broker: the rendered bootstrap table, then ``flux run`` on every rank."""
    return [
        "flux",
        "broker",
        f"--config-path={FLUX_CONFIG_DIR}",
        f"-Stbon.interface-hint={spec.interface}",
        "flux",
        "run",
        "-N",
        str(spec.size),
        "hostname",
    ]


def flux_cert_container() -> Obj:
    """Copy the CURVE certificate to a 0400 file owned by the Flux image's user."""
    source = f"{CURVE_SECRET_DIR}/{CURVE_CERT_FILE}"
    command = ["/bin/sh", "-c", CERT_COPY_SCRIPT, "copy-curve-cert", source, DEFAULT_CURVE_CERT]
    mounts: list[Obj] = [
        {"name": "flux-curve-secret", "mountPath": CURVE_SECRET_DIR, "readOnly": True},
        {"name": "flux-curve-cert", "mountPath": _cert_dir()},
    ]
    return _flux_image_container(
        "flux-curve-cert", command, resources("10m", "16Mi", "64Mi"), mounts
    )


def flux_container(spec: MeshSpec, port: int) -> Obj:
    """The example's main container: wait for ``/readyz``, then ``flux broker``."""
    script = flux_start_script(readyz_host(spec), port, broker_argv(spec))
    mounts: list[Obj] = [
        {"name": "flux-config", "mountPath": FLUX_CONFIG_DIR, "readOnly": True},
        {"name": "flux-curve-cert", "mountPath": _cert_dir(), "readOnly": True},
    ]
    command = ["/bin/bash", "-c", script, "flux-start"]
    return _flux_image_container("flux", command, resources("250m", "256Mi", "1Gi"), mounts)


def _flux_image_container(name: str, command: list[str], limits: Obj, mounts: list[Obj]) -> Obj:
    # The image's own user (flux-sched's images end with a named non-root USER);
    # the copy and the broker run as the same one, so the copy is the broker's.
    return {
        "name": name,
        "image": FLUX_IMAGE,
        "command": command,
        "resources": limits,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }


def resources(cpu: str, memory: str, memory_limit: str) -> Obj:
    """Requests of CPU and memory, a memory limit (no CPU limit: no throttling)."""
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory_limit}}


def flux_volumes(spec: MeshSpec, job: str) -> list[Obj]:
    """The bootstrap table, the certificate Secret (world-readable inside the copying
    container only) and the in-memory directory its 0400 copy goes to."""
    return [
        config_volume(spec, "flux-config", BOOTSTRAP_KEY),
        {
            "name": "flux-curve-secret",
            "secret": {"secretName": f"{job}-curve-cert", "defaultMode": 0o444},
        },
        {"name": "flux-curve-cert", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]


def _cert_dir() -> str:
    return DEFAULT_CURVE_CERT.rpartition("/")[0]


def listens_on_ipv6(spec: MeshSpec) -> bool:
    return spec.http.listen is not None and spec.http.listen.startswith("[")


def field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(path: str, *, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "vnetd-http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def config_volume(spec: MeshSpec, name: str, key: str) -> Obj:
    return {
        "name": name,
        "configMap": {"name": config_name(spec), "items": [{"key": key, "path": key}]},
    }


def host_dir(name: str, path: str) -> Obj:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def tun_volume() -> Obj:
    return {"name": "dev-net-tun", "hostPath": {"path": TUN_DEVICE, "type": "CharDevice"}}
