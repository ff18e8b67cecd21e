"""Each pod's own rank certificate: cert-manager's csi-driver volume in the vnetd container.

Where the spec pins rank CAs (``[mesh] rank_ca``), readers take a record at rank k
only with a certificate a pinned CA issued for k (``control.rank_cert``), so the
manifests give every pod one, and only the vnetd container mounts it:

* a CSI volume of ``csi.cert-manager.io`` (cert-manager's csi-driver): on the pod's
  node the driver makes an Ed25519 key, has the namespaced Issuer ``ISSUER`` (a CA
  Issuer whose key the spec pins) sign it with the URI SAN
  ``vnetd://<mesh>/<namespace>/<pod name>/<pod uid>``, and writes ``tls.key`` and
  ``tls.crt`` (mode 0440, owner root: vnetd's UID 0 reads them with every
  capability dropped, so no ``fs-group``) on a tmpfs that ends with the pod;
* ``vnetd up --signing-key-file <dir>/tls.key --rank-cert-file <dir>/tls.crt``.

The pod's name carries its rank: an Indexed Job's pod is ``<job>-<index>-<5
characters>`` and a StatefulSet's ``<name>-<ordinal>`` (``control.rank_cert`` maps
both), so a pod of index 2 holds a certificate readers take at rank 2 only. The
key survives renewals (``reuse-private-key``): readers refuse a renewal under a new
key. Why this mechanism, and what each holder can do: docs/kubernetes.md, "Rank
certificates"; docs/security.md.

Pure: dictionaries only.
"""

from __future__ import annotations

from typing import Any

from vnetd.errors import SpecError
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

CSI_DRIVER = "csi.cert-manager.io"
RANK_CERT_DIR = "/etc/vnetd-rank"
"""Where the vnetd container mounts the volume (no other container mounts it)."""
VOLUME = "vnetd-rank-cert"
DURATION = "24h"
"""A day, renewed by the driver at two thirds (16 h); vnetd follows the file."""
MAX_GENERATED_NAME = 58
"""Kubernetes cuts a ``generateName`` prefix (``<job>-<index>-``) to this many characters
(``MaxGeneratedNameLength``), which would drop the index from a Job pod's name."""


def issuer_name(spec: MeshSpec) -> str:
    """The namespaced CA Issuer whose key ``[mesh] rank_ca`` pins."""
    return f"vnetd-{spec.name}-ranks"


def uri_san(spec: MeshSpec) -> str:
    """The URI SAN template the driver fills from the pod (``control.rank_cert`` reads it)."""
    return f"vnetd://{spec.name}/${{POD_NAMESPACE}}/${{POD_NAME}}/${{POD_UID}}"


def volume_attributes(spec: MeshSpec) -> dict[str, str]:
    """The csi-driver's attributes: an Ed25519 signing key vouched for at the pod's rank."""
    return {
        f"{CSI_DRIVER}/issuer-name": issuer_name(spec),
        f"{CSI_DRIVER}/issuer-kind": "Issuer",
        f"{CSI_DRIVER}/key-algorithm": "Ed25519",
        # The record signing key only: TLS to etcd keeps its own Secret.
        f"{CSI_DRIVER}/key-usages": "digital signature",
        f"{CSI_DRIVER}/uri-sans": uri_san(spec),
        f"{CSI_DRIVER}/duration": DURATION,
        f"{CSI_DRIVER}/reuse-private-key": "true",
    }


def rank_cert_args() -> list[str]:
    """``vnetd up``'s flags: the pod's key signs its records, its certificate rides in them."""
    return [
        "--signing-key-file",
        f"{RANK_CERT_DIR}/tls.key",
        "--rank-cert-file",
        f"{RANK_CERT_DIR}/tls.crt",
    ]


def check_job_pod_names(spec: MeshSpec, job: str) -> None:
    """Refuse a Job whose pods' names would lose their index.

    Raises:
        SpecError: ``<job>-<last index>-`` is longer than ``MAX_GENERATED_NAME``.
    """
    prefix = f"{job}-{spec.size - 1}-"
    if len(prefix) > MAX_GENERATED_NAME:
        raise SpecError(
            f"mesh.name: the Job's pods would be named {prefix}xxxxx, over Kubernetes' "
            f"{MAX_GENERATED_NAME}-character prefix, which is cut and loses the index their "
            "rank certificate is issued for; use a shorter mesh.name"
        )


def check_no_pinned_gateway(spec: MeshSpec, ranks: range) -> None:
    """Refuse rank certificates for pods of ``ranks`` whose signing key the spec pins.

    Raises:
        SpecError: a gateway among ``ranks`` has ``gateway_keys``: the driver makes a new
            key per pod, which is never the pinned one, so readers would refuse it.
    """
    pinned = [rank for rank in ranks if spec.pinned_key(rank) is not None]
    if spec.rank_ca and pinned:
        site = spec.site_of_gateway(pinned[0])
        raise SpecError(
            f"sites.{site}.gateway_keys: rank {pinned[0]}'s signing key is pinned, and with "
            "mesh.rank_ca each pod signs with the key the csi-driver makes for it, never the "
            "pinned one; drop the pin (the rank certificate vouches for the key) or rank_ca"
        )


def with_rank_cert(spec: MeshSpec, container: Obj, volumes: list[Obj]) -> None:
    """Add the flags and the csi-driver's volume to the vnetd ``container`` (and to the
    pod's ``volumes``) when the spec pins ``rank_ca``; nothing otherwise."""
    if not spec.rank_ca:
        return
    container["args"] += rank_cert_args()
    container["volumeMounts"].append({"name": VOLUME, "mountPath": RANK_CERT_DIR, "readOnly": True})
    volumes.append(
        {
            "name": VOLUME,
            # readOnly on the volume itself: the kubelet passes it to the driver, which
            # refuses a volume without it.
            "csi": {"driver": CSI_DRIVER, "readOnly": True,
                    "volumeAttributes": volume_attributes(spec)},
        }
    )  # fmt: skip


def refuse_for_daemonset(spec: MeshSpec) -> None:
    """Raises: SpecError: the spec pins ``rank_ca``, which no DaemonSet pod can satisfy."""
    if spec.rank_ca:
        raise SpecError(
            "mesh.rank_ca: a DaemonSet chooses each pod's rank at run time (--rank auto), "
            "so no certificate can name it in advance and readers would refuse every "
            "record; render --mode sidecar, or drop rank_ca from this mesh's spec"
        )
