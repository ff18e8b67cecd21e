"""A MiniCluster as one site of a burst: ``vnetd render minicluster --site NAME --ranks A-B``.

The MiniCluster runs the ranks ``A..B`` of a mesh whose other ranks run in
another cluster; the pieces are ``site_manifests``' (the part's checks, the
public endpoint files, the gateways' load balancers and IP forwarding),
shaped for the Flux Operator's pods (docs/bursting.md, "A MiniCluster as a
site"). What the operator's source fixes, at both pinned versions:

* its pods are an Indexed Job named after the MiniCluster: Job index ``i``
  is host ``<name>-<i>`` from 0, whatever ranks the site runs. So index
  ``i`` is rank ``A + i``: vnetd is given ``--rank "$((A +
  JOB_COMPLETION_INDEX))"`` (a container's command is a line of the
  operator's shell script, and its environment literal values), and the Flux
  broker ``FLUX_FAKE_HOSTNAME=<name>-<A + i>``, exported by the Flux
  container's ``pre``: flux-core's ``boot_config`` looks that name up in
  ``[bootstrap] hosts`` instead of the kernel's (flux-start(1),
  ``--test-hosts``, documents it). Both sites' MiniClusters are named
  ``mesh.name``, in two clusters or namespaces, so the bootstrap table is
  one file for both;
* the operator encodes R for ``bursting.hostlist`` when given, else for
  ``<name>-[0-(maxSize-1)]``: a site's ``maxSize`` is its own ranks (a
  resize past them would start another site's ranks), so the hostlist is
  rendered as every host of the mesh and R names the burst site's brokers too;
* its ``wait.sh`` treats the pod whose host name is ``<name>-0`` as the
  lead broker and runs ``flux start ... flux submit <command>`` there. In
  site ``b`` that pod's broker is rank ``A``, and flux-core runs the
  initial program on rank 0 only, so it serves as a worker: the job runs
  once, from site a's rank 0. It lacks the worker branch's 15 s restart
  loop, which with fixed addresses has nothing to wait out;
* a container cannot be privileged only in some pods, and the operator
  has no init containers: IP forwarding is a third container,
  ``vnetd-forwarding``, privileged in every pod of a site with gateways,
  which writes the sysctls only in a gateway's pod and exits 0.

Pure: dictionaries and strings in, dictionaries and strings out.
"""

from __future__ import annotations

import shlex
from typing import Any

from vnetd.errors import SpecError
from vnetd.ranks import format_ranks
from vnetd.render.pods import resources
from vnetd.render.site_manifests import (
    JOB_INDEX_KEY,
    PUBLIC_DIR,
    SitePart,
    forwarding_command,
    gateway_service,
    public_endpoints,
    public_name,
    site_part,
    vnetd_site_args,
)
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"
"""The Job controller's variable in every container of an Indexed Job's pod."""
FORWARDING_CONTAINER = "vnetd-forwarding"


def minicluster_part(spec: MeshSpec, site: str | None, ranks: str) -> SitePart | None:
    """The part ``--site`` and ``--ranks`` select, as ``render manifests`` checks them.

    Raises:
        SpecError: one line naming the flag, or the pinned gateway keys this render cannot
            give a pod (their Secret copy is ``render manifests``' init container).
    """
    part = site_part(spec, "sidecar", site, ranks)
    if part is None:
        return None
    pinned = [rank for rank in part.gateways if spec.pinned_key(rank)]
    if pinned:
        raise SpecError(
            f"[sites.{part.site}] gateway_keys: a MiniCluster has no init container to put "
            f"gateway {format_ranks(pinned)}'s pinned signing key in its state dir; render "
            f"site {part.site} with `vnetd render manifests --site {part.site}`, or unpin it"
        )
    return part


def rank_expression(part: SitePart | None) -> str:
    """The pod's rank in the operator's shell scripts: ``A`` plus its Job index."""
    first = 0 if part is None else part.first
    return f"$(({first} + {JOB_INDEX_ENV}))" if first else f"${JOB_INDEX_ENV}"


def shell_join(argv: list[str]) -> str:
    """``shlex.join``, but a word holding the rank expression is double-quoted, so the
    shell expands it (its other characters need no quoting: paths and flags)."""
    words = []
    for arg in argv:
        if JOB_INDEX_ENV in arg:
            assert not set(arg) & set('"\\`'), arg
            words.append(f'"{arg}"')
        else:
            words.append(shlex.quote(arg))
    return " ".join(words)


def site_vnetd_args(part: SitePart | None, etcd: tuple[str, ...]) -> list[str]:
    """vnetd's flags for the part: ``--etcd``, ``--site``, the public endpoint file of its
    rank where the part runs gateways, and ``--rank`` where its first rank is not 0."""
    expression = rank_expression(part)
    args = vnetd_site_args(part, etcd, expression)
    if part is not None and part.first:
        args += ["--rank", expression]
    return args


def fake_hostname(spec: MeshSpec, part: SitePart | None) -> str | None:
    """The line the Flux container's ``pre`` starts with where the part's first rank is not
    0: the broker finds rank ``A + i`` in ``[bootstrap] hosts`` by this name."""
    if part is None or not part.first:
        return None
    return f'export FLUX_FAKE_HOSTNAME="{spec.name}-{rank_expression(part)}"'


def bursting_hostlist(spec: MeshSpec) -> str:
    """Every host of the mesh as an RFC 29 hostlist: what R is encoded for."""
    return f"{spec.name}-[0-{spec.size - 1}]" if spec.size > 1 else f"{spec.name}-0"


def public_volume(spec: MeshSpec, part: SitePart | None) -> Obj:
    """The public endpoints' ConfigMap, one file per rank, as an operator volume."""
    if part is None or not part.gateways:
        return {}
    name = public_name(spec)
    items = {str(rank): str(rank) for rank in range(part.first, part.last + 1)}
    volume = {"configMapName": name, "items": items, "path": PUBLIC_DIR, "readOnly": True}
    return {name: volume}


def forwarding_container(
    spec: MeshSpec, part: SitePart | None, image: str, core_security_context: bool
) -> Obj | None:
    """The privileged container that turns IP forwarding on in the gateways' pods, which
    it knows by their host names, ``<name>-<rank - A>``; None: the part has no gateway."""
    if part is None or not part.gateways:
        return None
    hosts = [f"{spec.name}-{rank - part.first}" for rank in part.gateways]
    security: Obj = {"privileged": True}
    if core_security_context:
        security |= {"runAsUser": 0, "runAsNonRoot": False}
    return {
        "name": FORWARDING_CONTAINER,
        "image": image,
        "command": shlex.join(forwarding_command(spec, hosts)),
        "resources": resources("10m", "16Mi", "32Mi"),
        "securityContext": security,
    }


def site_objects(spec: MeshSpec, part: SitePart | None, labels: Obj, selector: Obj) -> list[Obj]:
    """The public endpoints' ConfigMap and a load balancer per gateway of the part, each
    selecting its pod by the Job's index label among ``selector``'s pods."""
    if part is None or not part.gateways:
        return []
    services = [
        gateway_service(
            spec, spec.name, labels, {**selector, JOB_INDEX_KEY: str(rank - part.first)}, rank
        )
        for rank in part.gateways
    ]
    return [public_endpoints(spec, part, labels), *services]
