"""Kubernetes manifests of a mesh: ``vnetd render manifests``.

The spec is the single source of truth: this module turns it into the
objects that run the mesh, so size, names and ports cannot drift apart.

* ``sidecar``: a ConfigMap (the spec file as given, and the Flux bootstrap
  table rendered from it), a headless Service, and an Indexed Job of
  ``size`` pods. In each pod vnetd runs as a native sidecar (an init
  container with ``restartPolicy: Always``) whose startup probe hits
  ``/readyz``, so the main container starts only once the overlay interface
  holds the rank's address. The rank comes from ``JOB_COMPLETION_INDEX``.
  The main container runs Flux with the rendered bootstrap table: an
  example to replace.
* ``daemonset``: a ConfigMap and a host-network DaemonSet, one rank per
  labelled node (``--rank auto``).

An Indexed Job names its pods' hosts ``<job name>-<index>``, and Flux finds
a broker's rank by its host name, so the sidecar mode needs the spec's
``hostname`` pattern to be ``<job name>-{rank}``; the Job is named after it.

The output is a multi-document YAML stream with a fixed key order: the same
spec and options give the same bytes. The module is pure (no trio, httpx or
pyroute2); PyYAML only serialises.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from vnetd import __version__
from vnetd.dataplane.uapi_protocol import SOCKET_DIR
from vnetd.errors import SpecError
from vnetd.render.flux import DEFAULT_CURVE_CERT, render_flux
from vnetd.spec import MeshSpec, parse_spec

Mode = Literal["sidecar", "daemonset"]
MODES: tuple[Mode, ...] = ("sidecar", "daemonset")

DEFAULT_IMAGE = f"vnetd:{__version__}"
FLUX_IMAGE = "fluxrm/flux-sched:jammy"
DEFAULT_HTTP_PORT = 9090

SPEC_KEY = "mesh.toml"
BOOTSTRAP_KEY = "bootstrap.toml"
CONFIG_DIR = "/etc/vnetd"
FLUX_CONFIG_DIR = "/etc/flux/config"
STATE_DIR = "/var/lib/vnetd"
TUN_DEVICE = "/dev/net/tun"
MESH_LABEL = "vnetd/mesh"
SPEC_HASH_ANNOTATION = "vnetd/spec-sha256"

_LABEL = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_MAX_HOSTNAME = 63

Obj = dict[str, Any]


@dataclass(frozen=True)
class ManifestOptions:
    """What the spec does not say: the deployment mode and the vnetd image."""

    mode: Mode = "sidecar"
    image: str = DEFAULT_IMAGE


def render_manifests(spec: MeshSpec, spec_toml: str, options: ManifestOptions | None = None) -> str:
    """The manifests of ``spec`` as a YAML stream ending in a newline.

    Args:
        spec: the validated spec.
        spec_toml: the spec file's text, put into the ConfigMap as given; it
            must parse to ``spec``.

    Raises:
        SpecError: the spec cannot be deployed in this mode (naming the key),
            or the image is not an image reference (naming ``--image``).
        ValueError: ``spec_toml`` does not parse to ``spec``.
    """
    options = options or ManifestOptions()
    objects = manifest_objects(spec, spec_toml, options)
    header = (
        f"# Kubernetes manifests of mesh {spec.name} ({spec.size} ranks, {options.mode} mode),\n"
        "# rendered by `vnetd render manifests` from the spec in the ConfigMap below.\n"
        "# Change the spec and render again instead of editing this file.\n"
    )
    return header + yaml.dump_all(
        objects, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=4096
    )


def manifest_objects(spec: MeshSpec, spec_toml: str, options: ManifestOptions) -> list[Obj]:
    """The Kubernetes objects of the mesh, in the order they should be applied."""
    if _parse(spec_toml) != spec:
        raise ValueError("the spec text does not parse to the spec it was given with")
    image = check_image(options.image)
    port = http_port(spec)
    if options.mode == "sidecar":
        job = job_name(spec)
        data = {SPEC_KEY: spec_toml, BOOTSTRAP_KEY: render_flux(spec)}
        return [
            _config_map(spec, data),
            _headless_service(spec, job, port),
            _job(spec, job, image, port, _digest(data)),
        ]
    data = {SPEC_KEY: spec_toml}
    return [_config_map(spec, data), _daemon_set(spec, image, port, _digest(data))]


def job_name(spec: MeshSpec) -> str:
    """The Indexed Job whose pods' host names are the spec's host names.

    Raises:
        SpecError: ``mesh.hostname`` is not ``<job name>-{rank}``.
    """
    pattern = spec.hostname.replace("{name}", spec.name)
    prefix, sep, rest = pattern.rpartition("-")
    if sep and rest == "{rank}" and _LABEL.fullmatch(prefix):
        longest = f"{prefix}-{spec.size - 1}"
        if len(longest) <= _MAX_HOSTNAME:
            return prefix
        raise SpecError(
            f"mesh.hostname: {longest!r} is longer than {_MAX_HOSTNAME} characters, "
            "the limit of a pod's host name; use a shorter mesh.name"
        )
    raise SpecError(
        f"mesh.hostname: {spec.hostname!r} cannot be a pod host name in an Indexed Job, "
        "which is always '<job name>-<index>'; use '{name}-{rank}' (a mesh.name that "
        "starts with a letter) or 'JOB-{rank}' with JOB a lowercase DNS label"
    )


def http_port(spec: MeshSpec) -> int:
    """The port of the health endpoint the probes hit: ``http.listen``'s, else 9090.

    Raises:
        SpecError: ``http.listen`` asks for port 0, which no probe can find.
    """
    if spec.http.listen is None:
        return DEFAULT_HTTP_PORT
    port = int(spec.http.listen.rpartition(":")[2])
    if port == 0:
        raise SpecError(
            f"http.listen: {spec.http.listen!r} picks a free port, which the kubelet's "
            "probes cannot find; give a fixed port such as 0.0.0.0:9090"
        )
    return port


def check_image(image: str) -> str:
    """Refuse an image reference that is empty or holds spaces or control characters."""
    if not _IMAGE.fullmatch(image):
        raise SpecError(
            f"--image: {image!r} is not an image reference like registry.example.org/vnetd:0.1.0"
        )
    return image


def manifest_warnings(spec: MeshSpec) -> list[str]:
    """Problems that make the manifests useless although they are valid."""
    warnings = []
    for url in spec.registry.endpoints:
        host = urlsplit(url).hostname or ""
        if host == "localhost" or _is_loopback(host):
            warnings.append(
                f"registry.endpoints: {url} is a loopback address, which in a pod is the pod "
                "itself; point it at etcd's client Service (http://etcd-client:2379 for "
                "manifests/etcd)"
            )
    return warnings


def _is_loopback(host: str) -> bool:
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _parse(spec_toml: str) -> MeshSpec:
    return parse_spec(tomllib.loads(spec_toml))


def _digest(data: dict[str, str]) -> str:
    text = "".join(f"{key}\0{value}\0" for key, value in sorted(data.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _labels(spec: MeshSpec, component: str) -> Obj:
    return {
        "app.kubernetes.io/name": "vnetd",
        "app.kubernetes.io/component": component,
        MESH_LABEL: spec.name,
    }


def _config_name(spec: MeshSpec) -> str:
    return f"{spec.name}-vnetd"


def _config_map(spec: MeshSpec, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": _config_name(spec), "labels": _labels(spec, "config")},
        "data": data,
    }


def _headless_service(spec: MeshSpec, job: str, port: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job, "labels": _labels(spec, "sidecar")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": _labels(spec, "sidecar"),
            "ports": [
                {"name": "wireguard", "port": spec.port, "protocol": "UDP"},
                {"name": "vnetd-http", "port": port, "protocol": "TCP"},
            ],
        },
    }


def _job(spec: MeshSpec, job: str, image: str, port: int, digest: str) -> Obj:
    sidecar = _vnetd_container(spec, image, port, ["--config", f"{CONFIG_DIR}/{SPEC_KEY}"])
    sidecar["restartPolicy"] = "Always"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job, "labels": _labels(spec, "sidecar")},
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.size,
            "parallelism": spec.size,
            "backoffLimit": 3,
            "template": {
                "metadata": {
                    "labels": _labels(spec, "sidecar"),
                    "annotations": {SPEC_HASH_ANNOTATION: digest},
                },
                "spec": {
                    "subdomain": job,
                    # Never, not OnFailure: with OnFailure the Job controller adds up the
                    # restarts of every container, sidecars included, over all pods and
                    # fails the whole Job at backoffLimit; with Never only failed pods count.
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "initContainers": [sidecar],
                    "containers": [_flux_container(spec)],
                    "volumes": [
                        _config_volume(spec, "vnetd-config", SPEC_KEY),
                        _config_volume(spec, "flux-config", BOOTSTRAP_KEY),
                        {
                            "name": "flux-curve-cert",
                            "secret": {"secretName": f"{job}-curve-cert", "defaultMode": 0o400},
                        },
                        {"name": "vnetd-state", "emptyDir": {}},
                        {"name": "wireguard-sock", "emptyDir": {}},
                        _tun_volume(),
                    ],
                },
            },
        },
    }


def _daemon_set(spec: MeshSpec, image: str, port: int, digest: str) -> Obj:
    container = _vnetd_container(
        spec,
        image,
        port,
        ["--config", f"{CONFIG_DIR}/{SPEC_KEY}", "--rank", "auto", "--instance", "$(NODE_NAME)"],
    )
    container["env"].append(_field_env("NODE_NAME", "spec.nodeName"))
    labels = _labels(spec, "daemonset")
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": f"{spec.name}-vnetd", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {SPEC_HASH_ANNOTATION: digest}},
                "spec": {
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "nodeSelector": {MESH_LABEL: spec.name},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": [
                        _config_volume(spec, "vnetd-config", SPEC_KEY),
                        _host_dir("vnetd-state", f"{STATE_DIR}/{spec.name}"),
                        _host_dir("wireguard-sock", SOCKET_DIR),
                        _tun_volume(),
                    ],
                },
            },
        },
    }


def _vnetd_container(spec: MeshSpec, image: str, port: int, identity: list[str]) -> Obj:
    listen_host = "[::]" if _listens_on_ipv6(spec) else "0.0.0.0"
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
            _field_env("POD_IP", "status.podIP"),
            _field_env("POD_NAME", "metadata.name"),
        ],
        "ports": [
            {"name": "wireguard", "containerPort": spec.port, "protocol": "UDP"},
            {"name": "vnetd-http", "containerPort": port, "protocol": "TCP"},
        ],
        "startupProbe": _probe("/readyz", period=1, failures=300),
        "readinessProbe": _probe("/readyz", period=10, failures=3),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
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


def _flux_container(spec: MeshSpec) -> Obj:
    broker_options = f"-o,--config-path={FLUX_CONFIG_DIR},-Stbon.interface-hint={spec.interface}"
    return {
        "name": "flux",
        "image": FLUX_IMAGE,
        "command": [
            "flux",
            "start",
            broker_options,
            "flux",
            "run",
            "-N",
            str(spec.size),
            "hostname",
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": [
            {"name": "flux-config", "mountPath": FLUX_CONFIG_DIR, "readOnly": True},
            {
                "name": "flux-curve-cert",
                "mountPath": DEFAULT_CURVE_CERT.rpartition("/")[0],
                "readOnly": True,
            },
        ],
    }


def _listens_on_ipv6(spec: MeshSpec) -> bool:
    return spec.http.listen is not None and spec.http.listen.startswith("[")


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(path: str, *, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "vnetd-http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _config_volume(spec: MeshSpec, name: str, key: str) -> Obj:
    return {
        "name": name,
        "configMap": {"name": _config_name(spec), "items": [{"key": key, "path": key}]},
    }


def _host_dir(name: str, path: str) -> Obj:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _tun_volume() -> Obj:
    return {"name": "dev-net-tun", "hostPath": {"path": TUN_DEVICE, "type": "CharDevice"}}


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings; sequences indented under their key; no aliases."""

    def ignore_aliases(self, data: Any) -> bool:  # noqa: ANN401 - PyYAML passes any node value
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)
