"""A Flux Operator MiniCluster (``flux-framework.org/v1alpha2``) on vnetd's overlay.

``vnetd render minicluster`` writes a ConfigMap with the spec, a MiniCluster
whose ``spec.flux.brokerConfig`` is the pinned operator's own broker config
with ``vnetd render flux``'s ``[bootstrap]`` in place of its DNS-named one (a
given config replaces the operator's whole file, so its other tables are
written here: ``operator_versions.broker_config``), a PodDisruptionBudget for
its pods (and, opt-in, a NetworkPolicy for the mesh's UDP port and the
metrics port). vnetd runs as a second container of every pod; the Flux
container's ``commands.pre`` waits for vnetd's ``/readyz``, then at the mesh
gate (``/gatez``: the ranks its broker connects to answer over the overlay,
bounded by ``--gate-timeout``) before the operator's script starts the broker. The Job is bounded by
``deadlineSeconds`` and, where the version has the field, fails at its
first container restart. What the operator still does and what vnetd
replaces: ``docs/flux.md``.

Facts of the operator this follows (read from its v1alpha2 API, controllers
and scripts at commit 0d75cef8 and tag 0.2.1; those that differ between the
versions are ``operator_versions.OPERATOR_VERSIONS``, checked against a clone of
the operator by ``scripts/check_operator_facts.py``):

* ``spec.size`` is that Job's completions and parallelism, the pods it starts
  with; ``spec.maxSize`` (default ``size``) bounds a resize (``kubectl scale``:
  the CRD's scale subresource is ``spec.size``) and is the host list
  ``<name>-[0-(maxSize-1)]`` the operator encodes R for; with ``maxSize >
  size`` its ``wait.sh`` passes ``-Sbroker.quorum=<size>`` (``getRequiredRanks``),
  so rank 0 starts once that many brokers are up and the others join at their
  fixed addresses when the Job grows. The rendered ``maxSize`` is every rank
  the MiniCluster holds, the bootstrap's every host;
* the pods are an Indexed Job named after the MiniCluster, so host
  ``<name>-<index>``, and ``JOB_COMPLETION_INDEX`` gives vnetd its rank; they
  are ``restartPolicy: OnFailure``, so a pod completes only once every
  container has exited 0: vnetd exits with the job when ``wait.sh`` touches
  the version's marker (``--exit-on-file``);
* a container that does not run Flux is started through the operator's
  bash ``start.sh``, which inserts ``command`` as a line, waits for the Flux
  socket unless ``flux.noWaitSocket`` (set: Flux waits for vnetd, so that wait
  would never end) and appends the Flux view's Python to ``PYTHONPATH``
  (unset here, so vnetd imports its own packages);
* the operator sets ``app.kubernetes.io/name`` of its pods to the
  MiniCluster's name, over ``spec.pod.labels``, which it otherwise keeps, and
  copies ``spec.pod.annotations`` to the pod template;
* it makes a Service named after each non-Flux container that declares a
  port, so the vnetd container declares none (``monitoring`` scrapes it by
  relabeling);
* a ConfigMap volume is named after its ConfigMap, so its key must be that
  name; a ``hostPath`` volume has type Directory (0.2.1: no type, and its path
  is the mount path), so ``/dev/net`` is mounted rather than the tun device;
  a Secret volume is mounted 0644 with every key (``secretfiles``);
* container environments are literal values: no downward API, so vnetd's
  endpoint is its default route's address (the pod IP) and its instance the
  host name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnetd.errors import SpecError
from vnetd.render.flux import FluxOptions, render_flux
from vnetd.render.manifests import (
    DEFAULT_IMAGE,
    check_image,
    disruption_budget,
    http_port,
    job_name,
    labels,
    manifest_objects_header,
    yaml_stream,
)
from vnetd.render.minicluster_pods import mesh_policy, pod_annotations, pod_labels, pod_selector
from vnetd.render.minicluster_site import (
    bursting_hostlist,
    fake_hostname,
    forwarding_container,
    minicluster_part,
    public_volume,
    shell_join,
    site_objects,
    site_vnetd_args,
)
from vnetd.render.operator_versions import (
    DEFAULT_OPERATOR_VERSION,
    DEFAULT_QUEUE_POLICY,
    OPERATOR_VERSIONS,
    VIEW,
    OperatorVersion,
    operator_version,
)
from vnetd.render.operator_versions import broker_config as operator_broker_config
from vnetd.render.pods import (
    CONFIG_DIR,
    ETCD_CLIENT_SECRET,
    SPEC_KEY,
    STATE_DIR,
    VNETD_MOUNTS,
    config_name,
    etcd_tls_dir,
    listens_on_ipv6,
    readyz_host,
    resources,
)
from vnetd.render.podscripts import GATE_TIMEOUT, mesh_gate_wait, readyz_wait
from vnetd.render.relays import check_relays, relay_objects, relay_url
from vnetd.render.secretfiles import (
    STAGING_DIR,
    copy_commands,
    secret_files,
    staged_volumes,
)
from vnetd.render.site_manifests import SitePart, etcd_args
from vnetd.spec import MeshSpec

API_VERSION = "flux-framework.org/v1alpha2"
OPERATOR_VIEW = VIEW
OPERATOR_MARKER = OPERATOR_VERSIONS[DEFAULT_OPERATOR_VERSION].marker
OPERATOR_CURVE_CERT = OPERATOR_VERSIONS[DEFAULT_OPERATOR_VERSION].curve_cert
DEFAULT_COMMAND = "hostname"
VNETD_CONTAINER = "vnetd"
DEFAULT_MONITORING_NAMESPACE = "monitoring"
DEV_NET = {"hostPath": "/dev/net", "path": "/dev/net"}
"""wireguard-go's ``/dev/net/tun`` from the node (the operator's host paths are
directories)."""
DEFAULT_DEADLINE = 4 * 3600
"""``spec.deadlineSeconds`` (the Job's ``activeDeadlineSeconds``): a working session. The
operator's own default, 31,500,000 s, holds the nodes of a hung MiniCluster for a year."""
BACKOFF_LIMIT = 1
"""``spec.backoffLimit``: under ``restartPolicy: OnFailure`` the Job controller sums the
containers' restarts, and 1 fails the Job at the first one (0 is the operator's 100)."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class MiniClusterOptions:
    """What the spec does not say: the images, the job, the operator version."""

    image: str = DEFAULT_IMAGE
    app_image: str | None = None
    """None: the distribution of the version's Flux view (``OperatorVersion.app_image``)."""
    command: str = DEFAULT_COMMAND
    operator_version: str = DEFAULT_OPERATOR_VERSION
    tasks: int | None = None
    """``spec.tasks``; None: one per pod it starts with (the operator's own default is 1)."""
    size: int | None = None
    """``spec.size``, the pods it starts with; None: every rank it holds (``spec.maxSize``)."""
    mesh_policy: bool = False
    """Also a NetworkPolicy admitting the mesh's UDP port from its own pods, and the
    metrics port from ``monitoring_namespace``."""
    monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE
    kernel_wireguard: bool = False
    """The least-privilege form: vnetd runs ``--dataplane kernel`` and the pods mount no
    host path (wireguard-go's ``/dev/net/tun`` is not needed); nodes need the module."""
    deadline: int = DEFAULT_DEADLINE
    """``spec.deadlineSeconds``: how long the Job may run before it fails."""
    queue_policy: str = DEFAULT_QUEUE_POLICY
    """Fluxion's queue policy, in the broker config and ``flux.scheduler.queuePolicy``."""
    gate_timeout: int | None = None
    """How long the Flux container waits at the mesh gate before it fails (``podscripts``);
    None: ``GATE_TIMEOUT``, or half the deadline when that is shorter."""
    site: str | None = None
    """``--site``: the MiniCluster is one site's part of the mesh (``minicluster_site``)."""
    ranks: str = "all"
    """``--ranks A-B``: the ranks it runs, Job index ``i`` being rank ``A + i``."""
    etcd: tuple[str, ...] = ()
    """``--etcd``: the client URLs vnetd uses instead of ``registry.endpoints``."""
    batch: bool = False
    """The Flux container's ``batch``: the operator submits each line of ``command`` in one
    ``flux batch`` (a nested instance, on the overlay by the broker config's hint)."""
    relays: int = 0
    """``--relays``: relay pods (a Deployment beside the MiniCluster) vnetd reads the
    members through (``relays``)."""
    relay_user: str | None = None
    """``--relay-user``: the relays' read-only etcd user, where the spec names one."""
    relay_issuer: str | None = None
    """``--relay-issuer``: the cert-manager Issuer of the relays' certificate."""


def broker_config(
    spec: MeshSpec,
    version: str = DEFAULT_OPERATOR_VERSION,
    queue_policy: str = DEFAULT_QUEUE_POLICY,
) -> str:
    """The operator's broker config for this MiniCluster whose ``[bootstrap]`` is ``vnetd
    render flux --curve-cert <the operator's copy>``: only the addresses come from vnetd.

    And ``[tbon] interface-hint``, the overlay interface: brokers bootstrapped by PMI (the
    nested instance of ``flux batch``, the operator's batch mode, or ``flux alloc``) take
    their TCP endpoints from that hint, inherited from the enclosing instance, else from the
    default route, the pod network (flux-config-tbon(5)). This instance boots from
    ``[bootstrap]``, which the hint does not change.
    """
    pinned = operator_version(version)
    bootstrap = render_flux(spec, FluxOptions(curve_cert=pinned.curve_cert))
    hint = f'\n[tbon]\ninterface-hint = "{spec.interface}"\n'
    return operator_broker_config(pinned, bootstrap, queue_policy) + hint


def minicluster_name(spec: MeshSpec) -> str:
    """The MiniCluster's name: its Indexed Job's, so the hosts' prefix, and the mesh's name.

    Raises:
        SpecError: the host names are not an Indexed Job's (``job_name``), or their Job is
            not named like the mesh (naming both and the fix).
    """
    name = job_name(spec)
    if name != spec.name:
        raise SpecError(
            f"mesh.name: {spec.name!r} is not the MiniCluster's name {name!r} that "
            f"mesh.hostname {spec.hostname!r} gives its pods; set mesh.name = {name!r} "
            "or mesh.hostname = '{name}-{rank}'"
        )
    return name


def render_minicluster(
    spec: MeshSpec, spec_toml: str, options: MiniClusterOptions | None = None
) -> str:
    """The ConfigMap, the MiniCluster and its PodDisruptionBudget as a YAML stream (and, for
    a site's part with gateways, ``minicluster_site.site_objects``).

    Raises:
        SpecError: the host names cannot be an Indexed Job's, the HTTP port is
            0, an image reference is malformed, a Secret file cannot be mounted,
            the version is unknown, ``--tasks`` below 1, ``--size`` outside the
            ranks it holds, or a part ``minicluster_part`` refuses (each naming its
            key or flag).
    """
    options = options or MiniClusterOptions()
    version = operator_version(options.operator_version)
    name = minicluster_name(spec)
    _refuse_rank_certs(spec, version)
    if spec.tree_fanout and spec.tree_fanout != version.tbon_fanout:
        raise SpecError(
            f"mesh.tree_fanout: {spec.tree_fanout} is not the tree the operator's brokers "
            f"use (tbon.fanout {version.tbon_fanout} at {version.name}): pairs of that tree "
            "would be lazy and the mesh gate would wait for their handshakes in vain; set "
            f"mesh.tree_fanout = {version.tbon_fanout}, or 0 for every pair eager"
        )
    port = http_port(spec)
    check_image(options.image, "--image")
    app_image = check_image(options.app_image or version.app_image, "--app-image")
    part = minicluster_part(spec, options.site, options.ranks)
    capacity = spec.size if part is None else part.count
    size = capacity if options.size is None else options.size
    if not 1 <= size <= capacity:
        raise SpecError(
            f"--size: {size} is not a number of pods the MiniCluster can start with; give "
            f"1 to {capacity} (the ranks it holds, its maxSize)"
        )
    check_relays(spec, options)
    tasks = size if options.tasks is None else options.tasks
    if tasks < 1:
        raise SpecError(f"--tasks: {tasks} is not a task count; give 1 or more")
    if options.deadline < 1:
        raise SpecError(
            f"--deadline: {options.deadline} is not a number of seconds; give 1 or more "
            "(how long the MiniCluster's Job may run)"
        )
    if options.gate_timeout is not None and not 1 <= options.gate_timeout < options.deadline:
        raise SpecError(
            f"--gate-timeout: {options.gate_timeout} is not a number of seconds below "
            f"--deadline {options.deadline}; give 1 to {options.deadline - 1} (how long "
            "each pod waits for the ranks its broker needs before the Job fails)"
        )
    flux = _flux_container(spec, port, options, app_image, version)
    if options.batch:
        flux["batch"] = True
    fake = fake_hostname(spec, part)
    if fake:
        flux["commands"]["pre"] = f"{fake}\n{flux['commands']['pre']}"
    forwarding = forwarding_container(spec, part, options.image, version.core_security_context)
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
            "size": size,
            "maxSize": capacity,
            "tasks": tasks,
            "deadlineSeconds": options.deadline,
            **({"backoffLimit": BACKOFF_LIMIT} if version.backoff_limit else {}),
            "pod": {"labels": pod_labels(spec), "annotations": pod_annotations(spec)},
            "flux": {
                "brokerConfig": broker_config(spec, version.name, options.queue_policy),
                "noWaitSocket": True,
                "scheduler": {"queuePolicy": options.queue_policy},
                **({} if part is None else {"bursting": {"hostlist": bursting_hostlist(spec)}}),
            },
            "containers": [
                flux,
                _vnetd_container(spec, port, options, version, part),
                *([] if forwarding is None else [forwarding]),
            ],
        },
    }
    budget = disruption_budget(spec, name, pod_selector(spec))
    budget["spec"]["minAvailable"] = size
    budget["metadata"]["labels"] = labels(spec, "minicluster")
    objects = [config_map, minicluster, budget]
    objects += site_objects(spec, part, labels(spec, "minicluster"), pod_selector(spec))
    if options.mesh_policy:
        objects.append(mesh_policy(spec, port, options.monitoring_namespace))
    objects += relay_objects(spec, options.image, options, etcd_args(options.etcd))
    header = manifest_objects_header(spec, "minicluster", "vnetd render minicluster")
    return header + yaml_stream(objects)


RANK_CERT_GAPS = {
    "0.2.1": "the Flux Operator 0.2.1 has no CSI volume for a container",
    "0d75cef8": "the Flux Operator at 0d75cef8 writes a container's csiDriver volume "
    "without csi.readOnly, which cert-manager's csi-driver refuses to mount",
}
"""Why each pinned version cannot give a pod its rank certificate (``rank_certs``): the
operator's ``getExistingVolumes`` sets only the driver and attributes, the kubelet passes
the volume's own ``csi.readOnly`` to the driver, and csi-lib's ``NodePublishVolume``
refuses ``readOnly: false`` (docs/flux.md, "Credentials")."""


def _refuse_rank_certs(spec: MeshSpec, version: OperatorVersion) -> None:
    if not spec.rank_ca:
        return
    gap = RANK_CERT_GAPS.get(version.name, f"the Flux Operator {version.name} was not checked")
    raise SpecError(
        f"mesh.rank_ca: {gap}, so no MiniCluster pod can hold its rank certificate and "
        "readers would refuse every record; render the mesh with `vnetd render manifests` "
        "(an Indexed Job), or drop rank_ca for this mesh"
    )


def _flux_container(
    spec: MeshSpec, port: int, options: MiniClusterOptions, app_image: str, version: OperatorVersion
) -> Obj:
    host = readyz_host(spec)
    timeout = options.gate_timeout or max(1, min(GATE_TIMEOUT, options.deadline // 2))
    gate = mesh_gate_wait(host, port, version.tbon_fanout, timeout)
    return {
        "image": app_image,
        "runFlux": True,
        "command": options.command,
        "commands": {"pre": readyz_wait(host, port) + gate},
    }


def _vnetd_container(
    spec: MeshSpec,
    port: int,
    options: MiniClusterOptions,
    version: OperatorVersion,
    part: SitePart | None,
) -> Obj:
    listen = f"{'[::]' if listens_on_ipv6(spec) else '0.0.0.0'}:{port}"
    argv = ["vnetd", "up", "--config", f"{CONFIG_DIR}/{SPEC_KEY}", "--state-dir", STATE_DIR,
            "--http-listen", listen, "--exit-on-file", version.marker]  # fmt: skip
    if options.kernel_wireguard:
        argv += ["--dataplane", "kernel"]
    argv += site_vnetd_args(part, options.etcd)
    argv += ["--relay", relay_url(spec)] if options.relays else []
    public = public_volume(spec, part)
    # The operator's own mounts are taken too, for the TLS directory as for the files.
    taken = (*VNETD_MOUNTS, OPERATOR_VIEW, STAGING_DIR, "/flux_operator")
    taken += tuple(volume["path"] for volume in public.values())
    tls_dir = etcd_tls_dir(spec, taken)
    files = secret_files(spec, (*taken, tls_dir) if tls_dir else taken)
    steps = [*copy_commands(files), f"exec {shell_join(argv)}"]
    volume = config_name(spec)
    return {
        "name": VNETD_CONTAINER,
        "image": options.image,
        "command": f"unset PYTHONPATH; {' && '.join(steps)}",
        # No "ports": the operator would make a Service named after the container.
        "resources": resources("50m", "64Mi", "256Mi"),
        "securityContext": _security_context(version),
        "volumes": {
            volume: {
                "configMapName": volume,
                "items": {SPEC_KEY: SPEC_KEY},
                "path": CONFIG_DIR,
                "readOnly": True,
            },
            **({} if options.kernel_wireguard else {"dev-net": DEV_NET}),
            **_etcd_tls_volume(tls_dir),
            **staged_volumes(files),
            **public,
        },
    }


def _security_context(version: OperatorVersion) -> Obj:
    if not version.core_security_context:
        # 0.2.1 can add capabilities but not set the user: the image's must be root.
        return {"addCapabilities": ["NET_ADMIN"]}
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _etcd_tls_volume(directory: str | None) -> Obj:
    if directory is None:
        return {}
    volume = {"secretName": ETCD_CLIENT_SECRET, "path": directory, "readOnly": True}
    return {ETCD_CLIENT_SECRET: volume}
