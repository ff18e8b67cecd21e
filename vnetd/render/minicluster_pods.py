"""The labels, annotations and NetworkPolicy of a MiniCluster's pods (``render.minicluster``).

What selects the pods the operator makes (``pod_selector``: from ``spec.pod.labels``,
which the operator keeps), what keeps a service mesh's sidecar out of them
(``pod_labels``, ``pod_annotations``), and the opt-in policy for a namespace that denies
ingress by default (``mesh_policy``).
"""

from __future__ import annotations

from typing import Any

from vnetd.render.manifests import labels
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""The label the API server sets on every namespace: its name."""


def pod_selector(spec: MeshSpec) -> Obj:
    """The labels that select the MiniCluster's pods, from ``spec.pod.labels``, which the
    operator keeps (it overwrites ``app.kubernetes.io/name`` with the MiniCluster's name);
    ``part-of: vnetd`` is what etcd's NetworkPolicy admits."""
    return {
        "app.kubernetes.io/part-of": "vnetd",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": "minicluster",
    }


def pod_labels(spec: MeshSpec) -> Obj:
    """``spec.pod.labels``: the selector's, and Istio's opt-outs that are labels (a sidecar
    label wins over a namespace's injection; ambient mode's is a label only)."""
    return {
        **pod_selector(spec),
        "sidecar.istio.io/inject": "false",
        "istio.io/dataplane-mode": "none",
    }


def pod_annotations(spec: MeshSpec) -> Obj:
    """``spec.pod.annotations``: no service mesh sidecar in these pods.

    A sidecar's capture takes Flux's TCP on the overlay interface (Istio's iptables
    redirect it, and STRICT mTLS refuses the brokers' plain ZeroMQ), and a sidecar that
    never exits keeps the pod, so the Job, from completing. Inert where no mesh runs.
    """
    return {
        "sidecar.istio.io/inject": "false",
        # Should a sidecar be injected anyway, its capture leaves the overlay alone.
        "traffic.sidecar.istio.io/excludeInterfaces": spec.interface,
        "linkerd.io/inject": "disabled",
    }


def mesh_udp_ports(spec: MeshSpec) -> list[int]:
    """The UDP ports the mesh's pods take from each other: WireGuard's, and the doorbell
    lazy pairs' first handshakes ring (``mesh.tree_fanout``)."""
    return [spec.port, *([spec.doorbell_port] if spec.tree_fanout else [])]


def mesh_policy(spec: MeshSpec, port: int, monitoring: str) -> Obj:
    """WireGuard's UDP port (and the doorbell's, with ``tree_fanout``) from the mesh's own
    pods, and vnetd's HTTP port (``/metrics``) from Prometheus' namespace, in a namespace
    whose policies deny ingress by default."""
    mesh = {"matchLabels": pod_selector(spec)}
    prometheus = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: monitoring}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{spec.name}-vnetd-mesh", "labels": labels(spec, "minicluster")},
        "spec": {
            "podSelector": mesh,
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": mesh}],
                    "ports": [{"port": udp, "protocol": "UDP"} for udp in mesh_udp_ports(spec)],
                },
                {"from": [prometheus], "ports": [{"port": port, "protocol": "TCP"}]},
            ],
        },
    }
