"""One site's part of a mesh as Kubernetes objects: ``render manifests --site --ranks``.

``manifests`` renders the sidecar objects of the whole mesh; with ``--site``
or ``--ranks`` this module checks those options against the spec's sites
and turns that output into the part one cluster runs (docs/bursting.md;
the routing itself is "Sites" in docs/architecture.md):

* the ranks ``A-B`` of the cluster: an Indexed Job of ``B-A+1`` pods when
  ``A`` is 0, else a StatefulSet whose ordinals start at ``A``, so that pod
  host names are still ``<job name>-<rank>`` (the rank comes from the host
  name, or ``JOB_COMPLETION_INDEX`` in a Job);
* ``--site NAME`` on every sidecar;
* for each gateway of the site among those ranks: a UDP ``LoadBalancer``
  Service selecting that one pod, a privileged init container that turns
  on IP forwarding in the gateway pods' network namespace only
  (``podscripts.FORWARDING_SCRIPT``), and a ConfigMap of public endpoints,
  one key per rank, that the sidecars follow with ``--public-endpoint-file``;
* for the gateways among those ranks whose signing key the spec pins
  (``gateway_keys``): the Secret ``GATEWAY_KEYS_SECRET`` (key
  ``gateway-<rank>.key`` each), mounted only in an unprivileged init
  container that copies the pod's own key, if it has one, into its state dir
  (``podscripts.SIGNING_KEY_SCRIPT``); a rescheduled gateway, whose
  ``emptyDir`` state dir is new, so signs with its pinned key again.

Pure: dictionaries in, dictionaries out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnetd.errors import SpecError
from vnetd.ranks import format_ranks, parse_ranks
from vnetd.render.pods import STATE_DIR, config_name, field_env, resources
from vnetd.render.podscripts import FORWARDING_SCRIPT, SIGNING_KEY_SCRIPT
from vnetd.render.secretfiles import GATEWAY_KEYS_SECRET
from vnetd.spec import MeshSpec
from vnetd.spec.parse import check_etcd_url, check_site_name

Obj = dict[str, Any]

GATEWAY_KEYS_DIR = "/etc/vnetd-gateway-keys"
"""Where that Secret is mounted, in the copying init container only."""
PUBLIC_DIR = "/etc/vnetd-public"
"""Where the public endpoints' ConfigMap is mounted: one file per rank, empty for none."""
POD_INDEX_ENV = "VNETD_POD_INDEX"
JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
"""The Job's pod label (1.28+) and annotation that hold the completion index."""
STATEFULSET_INDEX_LABEL = "apps.kubernetes.io/pod-index"
STATEFULSET_POD_LABEL = "statefulset.kubernetes.io/pod-name"
_MAX_NAME = 63


@dataclass(frozen=True)
class SitePart:
    """The ranks ``first..last`` one cluster runs, in ``site``; ``gateways`` among them."""

    site: str
    site_flag: bool
    """True: ``--site`` was given, so the sidecars get it too."""
    first: int
    last: int
    gateways: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    @property
    def described(self) -> str:
        return f"site {self.site}, ranks {self.first}-{self.last}"


def site_part(spec: MeshSpec, mode: str, site: str | None, ranks: str) -> SitePart | None:
    """The part ``--site`` and ``--ranks`` select; None without either (the whole mesh).

    Raises:
        SpecError: one line naming the flag and the fix.
    """
    if site is None and ranks.strip().lower() == "all":
        return None
    flag = "--site" if site is not None else "--ranks"
    if mode != "sidecar":
        raise SpecError(
            f"{flag}: the daemonset mode claims a rank per labelled node (--rank auto) and "
            "renders no site's part; use --mode sidecar, or add --site to the DaemonSet by hand"
        )
    name = spec.site.name if site is None else check_site_name(site, "--site")
    selected = parse_ranks(ranks, spec.size)
    first, last = selected[0], selected[-1]
    if len(selected) != last - first + 1:
        raise SpecError(
            f"--ranks: {ranks.strip()!r} is not one range; a cluster's pods are numbered "
            f"consecutively, so give A-B (for example {first}-{last}) and render the rest "
            "for another cluster"
        )
    for other, gateways in spec.gateways:
        foreign = [rank for rank in gateways if other != name and first <= rank <= last]
        if foreign:
            which = "rank {} is a gateway" if len(foreign) == 1 else "ranks {} are gateways"
            raise SpecError(
                f"--ranks: {which.format(format_ranks(foreign))} of site {other} "
                f"([sites.{other}] gateways), not of site {name}; render them with "
                f"--site {other}, or give --ranks without them"
            )
    own = dict(spec.gateways).get(name, ())
    return SitePart(
        site=name,
        site_flag=site is not None,
        first=first,
        last=last,
        gateways=tuple(rank for rank in own if first <= rank <= last),
    )


def site_warnings(spec: MeshSpec, part: SitePart | None) -> list[str]:
    """A site the spec does not name, in a spec that names sites: likely a typo."""
    named = [site for site, _ in spec.gateways]
    if part is None or not named or part.site in named:
        return []
    return [
        f"--site: the spec names sites {', '.join(named)} and not {part.site}; {part.site} "
        "has no gateways, so each of its members needs --public-endpoint or must be "
        "reachable from the other sites (docs/bursting.md)"
    ]


def etcd_args(etcd: tuple[str, ...]) -> list[str]:
    """``--etcd URL`` for each URL of ``render manifests --etcd``, checked."""
    return [arg for url in etcd for arg in ("--etcd", check_etcd_url(url))]


def vnetd_site_args(
    part: SitePart | None, etcd: tuple[str, ...] = (), rank: str = f"$({POD_INDEX_ENV})"
) -> list[str]:
    """The sidecar's extra flags: ``--etcd`` and ``--site`` when given, and the public
    endpoint file when the part runs gateways, named by ``rank``: the Kubernetes expansion
    of the pod's index, or a shell expression of its rank (``minicluster_site``)."""
    args = etcd_args(etcd)
    if part is None:
        return args
    args += ["--site", part.site] if part.site_flag else []
    if part.gateways:
        args += ["--public-endpoint-file", f"{PUBLIC_DIR}/{rank}"]
    return args


def site_objects(spec: MeshSpec, part: SitePart, objects: list[Obj], image: str) -> list[Obj]:
    """``objects`` (ConfigMap, headless Service, Job) made into the part ``part`` runs."""
    config, service, job = objects
    workload = _stateful_set(job, part) if part.first > 0 else _job_of(job, part)
    if not part.gateways:
        return [config, service, workload]
    name = job["metadata"]["name"]
    pod = workload["spec"]["template"]["spec"]
    pod["initContainers"].insert(0, _forwarding_container(spec, part, image))
    index_path = (
        f"metadata.labels['{STATEFULSET_INDEX_LABEL}']"
        if part.first > 0
        else f"metadata.annotations['{JOB_INDEX_KEY}']"
    )
    for container in pod["initContainers"]:
        if container["name"] == "vnetd":
            container["env"].append(field_env(POD_INDEX_ENV, index_path))
            container["volumeMounts"].append(
                {"name": "vnetd-public", "mountPath": PUBLIC_DIR, "readOnly": True}
            )
    pinned = [rank for rank in part.gateways if spec.pinned_key(rank) is not None]
    if pinned:
        vnetd = [c["name"] for c in pod["initContainers"]].index("vnetd")
        pod["initContainers"].insert(vnetd, _signing_key_container(image, index_path))
        pod["volumes"].append(_gateway_keys_volume(pinned))
    endpoints = public_endpoints(spec, part, config["metadata"]["labels"])
    pod["volumes"].append({"name": "vnetd-public", "configMap": {"name": public_name(spec)}})
    gateways = []
    for rank in part.gateways:
        selected = (
            {STATEFULSET_POD_LABEL: spec.host(rank)}
            if part.first > 0
            else {JOB_INDEX_KEY: str(rank - part.first)}
        )
        selector = {**service["spec"]["selector"], **selected}
        gateways.append(gateway_service(spec, name, service["metadata"]["labels"], selector, rank))
    return [config, endpoints, service, workload, *gateways]


def public_name(spec: MeshSpec) -> str:
    """The ConfigMap of the part's public endpoints, one key per rank."""
    return f"{config_name(spec)}-public"


def public_endpoints(spec: MeshSpec, part: SitePart, labels: Obj) -> Obj:
    """That ConfigMap, every rank of the part without one (``kubectl patch`` fills them)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": public_name(spec), "labels": labels},
        "data": {str(rank): "" for rank in range(part.first, part.last + 1)},
    }


def _job_of(job: Obj, part: SitePart) -> Obj:
    job["spec"]["completions"] = job["spec"]["parallelism"] = part.count
    return job


def _stateful_set(job: Obj, part: SitePart) -> Obj:
    """The Job's pods as a StatefulSet whose ordinals (so host names) start at the first rank."""
    template = job["spec"]["template"]
    pod = template["spec"]
    del pod["subdomain"]  # a StatefulSet sets it from serviceName
    pod["restartPolicy"] = "Always"  # the only policy a StatefulSet allows
    name = job["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": job["metadata"],
        "spec": {
            "serviceName": name,
            "replicas": part.count,
            "ordinals": {"start": part.first},
            # All at once, as a Job starts them: a broker tree forms only with every rank.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }


def forwarding_command(spec: MeshSpec, hosts: list[str]) -> list[str]:
    """``FORWARDING_SCRIPT``'s command: IP forwarding on in a pod whose host name is in
    ``hosts`` (the gateways' pods), for each IP version of the overlay."""
    versions = " ".join(str(version) for version in spec.versions)
    return ["/bin/sh", "-c", FORWARDING_SCRIPT, "forwarding", versions, *hosts]


def _forwarding_container(spec: MeshSpec, part: SitePart, image: str) -> Obj:
    hosts = [spec.host(rank) for rank in part.gateways]
    return {
        "name": "vnetd-forwarding",
        "image": image,
        "command": forwarding_command(spec, hosts),
        "resources": resources("10m", "16Mi", "32Mi"),
        # /proc/sys is read-only in any other container; this one only writes the
        # pod's own network namespace's sysctls, and only in a gateway's pod.
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "runAsNonRoot": False,
            "readOnlyRootFilesystem": True,
        },
    }


def _signing_key_container(image: str, index_path: str) -> Obj:
    """Copy the pod's pinned signing key, if the Secret has one, into its state dir."""
    script = ["/bin/sh", "-c", SIGNING_KEY_SCRIPT, "signing-key", GATEWAY_KEYS_DIR,
              f"$({POD_INDEX_ENV})", STATE_DIR]  # fmt: skip
    return {
        "name": "vnetd-signing-key",
        "image": image,
        "command": script,
        "env": [field_env(POD_INDEX_ENV, index_path)],
        "resources": resources("10m", "16Mi", "32Mi"),
        "securityContext": {
            "runAsUser": 0,  # the state dir is vnetd's, and vnetd runs as root
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "vnetd-gateway-keys", "mountPath": GATEWAY_KEYS_DIR, "readOnly": True},
            {"name": "vnetd-state", "mountPath": STATE_DIR},
        ],
    }


def _gateway_keys_volume(ranks: list[int]) -> Obj:
    """The pinned gateways' keys, each one required: a pod does not start without them."""
    items = [{"key": f"gateway-{rank}.key", "path": f"gateway-{rank}.key"} for rank in ranks]
    return {
        "name": "vnetd-gateway-keys",
        "secret": {"secretName": GATEWAY_KEYS_SECRET, "defaultMode": 0o400, "items": items},
    }


def gateway_service(spec: MeshSpec, job: str, labels: Obj, selector: Obj, rank: int) -> Obj:
    """Gateway ``rank``'s UDP load balancer, selecting its one pod by ``selector``.

    Raises:
        SpecError: its name would be too long for a Service (naming ``mesh.name``).
    """
    name = f"{job}-gateway-{rank}"
    if len(name) > _MAX_NAME:
        raise SpecError(
            f"mesh.name: the gateway Service {name!r} is longer than {_MAX_NAME} characters; "
            "use a shorter mesh.name"
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {**labels, "app.kubernetes.io/component": "gateway"}},
        "spec": {
            "type": "LoadBalancer",
            # The gateway sees its peers' own addresses, and only its node takes traffic.
            "externalTrafficPolicy": "Local",
            "selector": selector,
            "ports": [
                {"name": "wireguard", "port": spec.port, "targetPort": spec.port, "protocol": "UDP"}
            ],
        },
    }
