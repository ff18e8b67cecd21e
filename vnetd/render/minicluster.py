"""A Flux Operator MiniCluster (``flux-framework.org/v1alpha2``) on vnetd's overlay.

``vnetd render minicluster`` writes a ConfigMap with the spec and a
MiniCluster whose ``spec.flux.brokerConfig`` is ``vnetd render flux``'s
table (the operator then writes it as the brokers' config instead of its
own, whose ``connect`` URIs are pod DNS names), with the certificate path
the operator copies its CURVE certificate to. vnetd runs as a second
container of every pod; the Flux container's ``commands.pre`` waits for
vnetd's ``/readyz`` before the operator's script starts the broker. What
the operator still does and what vnetd replaces: ``docs/flux.md``.

Facts of the operator this follows (read from its v1alpha2 API and
controllers; the schema test holds the field names and types):

* the pods are an Indexed Job named after the MiniCluster, so host
  ``<name>-<index>``, and ``JOB_COMPLETION_INDEX`` gives vnetd its rank;
* a container that does not run Flux is started through the operator's
  bash ``start.sh``, which inserts ``command`` as a line, waits for the
  Flux socket unless ``flux.noWaitSocket`` (here it must not: Flux waits
  for vnetd) and appends the Flux view's Python to ``PYTHONPATH`` (unset
  here, so vnetd imports its own packages);
* a ConfigMap volume is named after its ConfigMap, so its key must be that
  name; a ``hostPath`` volume has type Directory, so ``/dev/net`` is mounted
  rather than the ``/dev/net/tun`` device itself;
* container environments are literal values: no downward API, so vnetd's
  endpoint is its default route's address (the pod IP) and its instance the
  host name.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from vnetd.render.flux import FluxOptions, render_flux
from vnetd.render.manifests import (
    DEFAULT_IMAGE,
    check_image,
    http_port,
    job_name,
    labels,
    manifest_objects_header,
    yaml_stream,
)
from vnetd.render.pods import (
    CONFIG_DIR,
    ETCD_CLIENT_SECRET,
    SPEC_KEY,
    STATE_DIR,
    config_name,
    etcd_tls_dir,
    listens_on_ipv6,
    readyz_host,
)
from vnetd.render.podscripts import readyz_wait
from vnetd.spec import MeshSpec

API_VERSION = "flux-framework.org/v1alpha2"
OPERATOR_VIEW = "/mnt/flux"
"""The operator's default ``flux.container.mountPath``, where it puts Flux and its config."""
OPERATOR_CURVE_CERT = f"{OPERATOR_VIEW}/config/curve/curve.cert"
"""Where the operator's start-up script copies the CURVE certificate (0400, the Flux user's)."""
DEFAULT_APP_IMAGE = "ubuntu:24.04"
"""The application container: any image the operator's Ubuntu noble Flux view runs in."""
DEFAULT_COMMAND = "hostname"

Obj = dict[str, Any]


@dataclass(frozen=True)
class MiniClusterOptions:
    """What the spec does not say: the images and the job's command."""

    image: str = DEFAULT_IMAGE
    app_image: str = DEFAULT_APP_IMAGE
    command: str = DEFAULT_COMMAND


def broker_config(spec: MeshSpec) -> str:
    """``vnetd render flux --curve-cert <the operator's copy>``: the brokers' whole config."""
    return render_flux(spec, FluxOptions(curve_cert=OPERATOR_CURVE_CERT))


def render_minicluster(
    spec: MeshSpec, spec_toml: str, options: MiniClusterOptions | None = None
) -> str:
    """The ConfigMap and the MiniCluster of ``spec`` as a YAML stream.

    Raises:
        SpecError: the host names cannot be an Indexed Job's, the HTTP port is
            0, or an image reference is malformed (each naming its key or flag).
    """
    options = options or MiniClusterOptions()
    name = job_name(spec)
    port = http_port(spec)
    check_image(options.image, "--image")
    check_image(options.app_image, "--app-image")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_name(spec), "labels": labels(spec, "config")},
        "data": {SPEC_KEY: spec_toml},
    }
    minicluster = {
        "apiVersion": API_VERSION,
        "kind": "MiniCluster",
        "metadata": {"name": name, "labels": labels(spec, "minicluster")},
        "spec": {
            "size": spec.size,
            "flux": {"brokerConfig": broker_config(spec), "noWaitSocket": True},
            "containers": [
                _flux_container(spec, port, options),
                _vnetd_container(spec, port, options),
            ],
        },
    }
    header = manifest_objects_header(spec, "minicluster", "vnetd render minicluster")
    return header + yaml_stream([config_map, minicluster])


def _flux_container(spec: MeshSpec, port: int, options: MiniClusterOptions) -> Obj:
    return {
        "image": options.app_image,
        "runFlux": True,
        "command": options.command,
        "commands": {"pre": readyz_wait(readyz_host(spec), port)},
    }


def _vnetd_container(spec: MeshSpec, port: int, options: MiniClusterOptions) -> Obj:
    listen = f"{'[::]' if listens_on_ipv6(spec) else '0.0.0.0'}:{port}"
    argv = ["vnetd", "up", "--config", f"{CONFIG_DIR}/{SPEC_KEY}", "--state-dir", STATE_DIR,
            "--http-listen", listen]  # fmt: skip
    volume = config_name(spec)
    return {
        "name": "vnetd",
        "image": options.image,
        "command": f"unset PYTHONPATH; exec {shlex.join(argv)}",
        "ports": [port],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": {
            volume: {
                "configMapName": volume,
                "items": {SPEC_KEY: SPEC_KEY},
                "path": CONFIG_DIR,
                "readOnly": True,
            },
            "dev-net": {"hostPath": "/dev/net", "path": "/dev/net"},
            **_etcd_tls_volume(spec),
        },
    }


def _etcd_tls_volume(spec: MeshSpec) -> Obj:
    directory = etcd_tls_dir(spec)
    if directory is None:
        return {}
    volume = {"secretName": ETCD_CLIENT_SECRET, "path": directory, "readOnly": True}
    return {ETCD_CLIENT_SECRET: volume}
