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
  example to replace (``pods``).
* ``daemonset``: a ConfigMap and a host-network DaemonSet, one rank per
  labelled node (``--rank auto``), of the PriorityClass
  ``manifests/daemonset/priorityclass.yaml`` defines.

Where the spec pins ``[mesh] rank_ca``, each sidecar mounts its pod's own rank
certificate (``rank_certs``); a DaemonSet, whose rank is chosen at run time, is
refused.

With ``--site`` or ``--ranks`` the sidecar objects become one site's part
(``site_manifests``); without them the output is the whole mesh's.

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
from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR
from vnetd.errors import SpecError
from vnetd.render.flux import render_flux
from vnetd.render.pods import (
    BOOTSTRAP_KEY,
    CONFIG_DIR,
    RUNTIME_DEFAULT_SECCOMP,
    SPEC_KEY,
    STATE_DIR,
    config_name,
    config_volume,
    field_env,
    flux_cert_container,
    flux_container,
    flux_volumes,
    host_dir,
    tun_volume,
    vnetd_container,
    with_etcd_tls,
    with_underlay_choice,
)
from vnetd.render.rank_certs import (
    check_job_pod_names,
    check_no_pinned_gateway,
    refuse_for_daemonset,
    with_rank_cert,
)
from vnetd.render.relays import relay_objects, with_relays
from vnetd.render.site_manifests import etcd_args, site_objects, site_part, vnetd_site_args
from vnetd.spec import MeshSpec, parse_spec

Mode = Literal["sidecar", "daemonset"]
MODES: tuple[Mode, ...] = ("sidecar", "daemonset")

PLACEHOLDER_REGISTRY = "registry.example.org"
DEFAULT_IMAGE = f"{PLACEHOLDER_REGISTRY}/vnetd:{__version__}"
"""No public vnetd image exists: build the Dockerfile and push it to your registry."""
DEFAULT_HTTP_PORT = 9090
PRIORITY_CLASS = "vnetd-node-critical"
JOB_ACTIVE_DEADLINE = 86400
"""A day: a Job whose quorum never forms must end (patch it for longer jobs)."""
JOB_TTL_AFTER_FINISHED = 3600
"""An hour to read a finished Job's logs before it is deleted."""

MESH_LABEL = "vnetd/mesh"
"""The node label a DaemonSet's nodes carry (nodes only; objects use app.kubernetes.io/*)."""
SPEC_HASH_ANNOTATION = "vnetd/spec-sha256"

_LABEL = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_MAX_HOSTNAME = 63

Obj = dict[str, Any]


@dataclass(frozen=True)
class ManifestOptions:
    """What the spec does not say: the deployment mode, the vnetd image, and which
    part of the mesh this cluster runs (``--site``; ``--ranks``, default all)."""

    mode: Mode = "sidecar"
    image: str = DEFAULT_IMAGE
    site: str | None = None
    ranks: str = "all"
    etcd: tuple[str, ...] = ()
    """``--etcd``: URLs the daemons use instead of ``registry.endpoints``."""
    relays: int = 0
    """``--relays``: relay pods the daemons read the members through (``relays``)."""
    relay_user: str | None = None
    """``--relay-user``: the relays' read-only etcd user, where the spec names one."""
    relay_issuer: str | None = None
    """``--relay-issuer``: the cert-manager Issuer of the relays' certificate."""


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
    part = site_part(spec, options.mode, options.site, options.ranks)
    what = f"{options.mode} mode" + ("" if part is None else f", {part.described}")
    header = manifest_objects_header(spec, what, "vnetd render manifests")
    return header + yaml_stream(objects)


def manifest_objects_header(
    spec: MeshSpec, what: str, command: str, source: str = "the spec in the ConfigMap below"
) -> str:
    """The comment that opens a rendered stream: what it is and how it was made."""
    return (
        f"# Kubernetes manifests of mesh {spec.name} ({spec.size} ranks, {what}),\n"
        f"# rendered by `{command}` from {source}.\n"
        "# Change the spec and render again instead of editing this file.\n"
    )


def yaml_stream(objects: list[Obj]) -> str:
    """Objects as a multi-document YAML stream, keys in the order given."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=4096)


def manifest_objects(spec: MeshSpec, spec_toml: str, options: ManifestOptions) -> list[Obj]:
    """The Kubernetes objects of the mesh, in the order they should be applied."""
    if _parse(spec_toml) != spec:
        raise ValueError("the spec text does not parse to the spec it was given with")
    image = check_image(options.image)
    port = http_port(spec)
    part = site_part(spec, options.mode, options.site, options.ranks)
    relays = relay_objects(spec, image, options, etcd_args(options.etcd))
    if options.mode == "sidecar":
        job = job_name(spec)
        ranks = range(spec.size) if part is None else range(part.first, part.last + 1)
        check_no_pinned_gateway(spec, ranks)
        if spec.rank_ca and (part is None or part.first == 0):
            check_job_pod_names(spec, job)
        data = {SPEC_KEY: spec_toml, BOOTSTRAP_KEY: render_flux(spec)}
        jobs = _job(spec, job, image, port, _digest(data), vnetd_site_args(part, options.etcd))
        with_relays(spec, jobs, options.relays)
        objects = [_config_map(spec, data), _headless_service(spec, job, port), jobs]
        if part is not None:
            return site_objects(spec, part, objects, image) + relays
        return [*objects, disruption_budget(spec, job, labels(spec, "sidecar")), *relays]
    refuse_for_daemonset(spec)
    data = {SPEC_KEY: spec_toml}
    daemons = _daemon_set(spec, image, port, _digest(data), etcd_args(options.etcd))
    with_relays(spec, daemons, options.relays)
    return [_config_map(spec, data), daemons, *relays]


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


def check_image(image: str, flag: str = "--image") -> str:
    """Refuse an image reference that is empty or holds spaces or control characters."""
    if not _IMAGE.fullmatch(image):
        raise SpecError(
            f"{flag}: {image!r} is not an image reference like registry.example.org/vnetd:0.1.0"
        )
    return image


def manifest_warnings(
    spec: MeshSpec, image: str = DEFAULT_IMAGE, etcd: tuple[str, ...] = ()
) -> list[str]:
    """Problems that make the manifests useless although they are valid; ``etcd``:
    the ``--etcd`` URLs, which replace ``registry.endpoints``."""
    warnings = []
    source = "--etcd" if etcd else "registry.endpoints"
    for url in etcd or spec.registry.endpoints:
        host = urlsplit(url).hostname or ""
        if host == "localhost" or _is_loopback(host):
            warnings.append(
                f"{source}: {url} is a loopback address, which in a pod is the pod "
                "itself; point it at etcd's client Service (https://etcd-client:2379 for "
                "manifests/etcd)"
            )
    if image.partition("/")[0] == PLACEHOLDER_REGISTRY:
        warnings.append(
            f"--image: {image} is a placeholder: build the Dockerfile, push it to your "
            "registry and give its name (docs/kubernetes.md, step 1)"
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


def labels(spec: MeshSpec, component: str) -> Obj:
    """The recommended ``app.kubernetes.io`` labels: the mesh is the instance."""
    return {
        "app.kubernetes.io/name": "vnetd",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def disruption_budget(spec: MeshSpec, name: str, selector: Obj) -> Obj:
    """Every rank stays while it runs: evicting one (a drain) would end the instance.
    A Job's pods have no scale subresource, so only an integer ``minAvailable`` works."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels(spec, "sidecar")},
        "spec": {"minAvailable": spec.size, "selector": {"matchLabels": selector}},
    }


def _config_map(spec: MeshSpec, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_name(spec), "labels": labels(spec, "config")},
        "data": data,
    }


def _headless_service(spec: MeshSpec, job: str, port: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job, "labels": labels(spec, "sidecar")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(spec, "sidecar"),
            "ports": [
                {"name": "wireguard", "port": spec.port, "protocol": "UDP"},
                {"name": "vnetd-http", "port": port, "protocol": "TCP"},
            ],
        },
    }


def _job(spec: MeshSpec, job: str, image: str, port: int, digest: str, extra: list[str]) -> Obj:
    identity = ["--config", f"{CONFIG_DIR}/{SPEC_KEY}", *extra]
    sidecar = vnetd_container(spec, image, port, identity)
    sidecar["restartPolicy"] = "Always"
    pod_labels = labels(spec, "sidecar")
    volumes = [
        config_volume(spec, "vnetd-config", SPEC_KEY),
        *flux_volumes(spec, job),
        {"name": "vnetd-state", "emptyDir": {}},
        {"name": "wireguard-sock", "emptyDir": {}},
        tun_volume(),
    ]
    with_etcd_tls(spec, sidecar, volumes)
    with_rank_cert(spec, sidecar, volumes)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job, "labels": pod_labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.size,
            "parallelism": spec.size,
            # A rank's pod may fail 3 times; once one rank has failed for good the
            # instance cannot finish, so the Job fails then (maxFailedIndexes 0).
            "backoffLimitPerIndex": 3,
            "maxFailedIndexes": 0,
            # An eviction (a drain, a preemption) is not the job's fault: it costs
            # no retry. The PodDisruptionBudget keeps voluntary ones away anyway.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            # A replacement pod starts only once the failed one is gone: both would
            # have the same host name and claim the same rank.
            "podReplacementPolicy": "Failed",
            "activeDeadlineSeconds": JOB_ACTIVE_DEADLINE,
            "ttlSecondsAfterFinished": JOB_TTL_AFTER_FINISHED,
            "template": {
                "metadata": {
                    "labels": pod_labels,
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
                    "securityContext": RUNTIME_DEFAULT_SECCOMP,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": pod_labels},
                        }
                    ],
                    "initContainers": [flux_cert_container(), sidecar],
                    "containers": [flux_container(spec, port)],
                    "volumes": volumes,
                },
            },
        },
    }


def _daemon_set(spec: MeshSpec, image: str, port: int, digest: str, extra: list[str]) -> Obj:
    identity = ["--config", f"{CONFIG_DIR}/{SPEC_KEY}", *extra]
    container = vnetd_container(
        spec, image, port, [*identity, "--rank", "auto", "--instance", "$(NODE_NAME)"]
    )
    container["env"].append(field_env("NODE_NAME", "spec.nodeName"))
    pod_labels = labels(spec, "daemonset")
    volumes = [
        config_volume(spec, "vnetd-config", SPEC_KEY),
        host_dir("vnetd-state", f"{STATE_DIR}/{spec.name}"),
        host_dir("wireguard-sock", SOCKET_DIR),
        tun_volume(),
    ]
    with_etcd_tls(spec, container, volumes)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": config_name(spec), "labels": pod_labels},
        "spec": {
            "selector": {"matchLabels": pod_labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {SPEC_HASH_ANNOTATION: digest}},
                "spec": {
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "priorityClassName": PRIORITY_CLASS,
                    "securityContext": RUNTIME_DEFAULT_SECCOMP,
                    "nodeSelector": {MESH_LABEL: spec.name},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [with_underlay_choice(container)],
                    "volumes": volumes,
                },
            },
        },
    }


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
