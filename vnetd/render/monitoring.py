"""Monitoring the Kubernetes way: ``vnetd render monitoring``.

A Prometheus Operator ``PodMonitor`` that scrapes ``/metrics`` on the pods'
``vnetd-http`` port (the mesh's name becomes the ``mesh`` label of every
series), and a ``PrometheusRule`` with the alerts ``docs/operations.md``
documents, for this mesh: ``ALERTS`` is their one definition, and the
documentation's PromQL block is ``promql_block`` of
``manifests/daemonset/mesh.toml`` (a test compares the two).

For a MiniCluster (``--minicluster``) the PodMonitor selects the labels the
Flux Operator keeps from ``spec.pod.labels`` and scrapes the vnetd container
at its HTTP port by relabeling: the rendered container declares no port,
because the operator makes a Service named after each container that
declares one (``controllers/flux/minicluster.go``), one per namespace, and
a PodMonitor's ``port``/``portNumber`` keep only declared ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnetd.errors import SpecError
from vnetd.render.manifests import http_port, labels, manifest_objects_header, yaml_stream
from vnetd.render.minicluster import VNETD_CONTAINER
from vnetd.render.minicluster_pods import pod_selector
from vnetd.render.pods import config_name
from vnetd.spec import MeshSpec

API_VERSION = "monitoring.coreos.com/v1"
SCRAPE_INTERVAL = "30s"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``expr`` holds ``{m}`` (the mesh selector) and ``{size}`` (the
    ranks expected to be registered)."""

    name: str
    summary: str
    expr: str
    duration: str | None = None
    severity: str = "warning"

    def promql(self, spec: MeshSpec, expected: int | None = None) -> str:
        size = spec.size if expected is None else expected
        return self.expr.format(m=f'mesh="{spec.name}"', size=size)


ALERTS = (
    Alert(
        "VnetdRankMissing",
        "A rank of the mesh has been missing for 5 minutes (seen from any daemon).",
        "max by (namespace) (vnetd_members_registered{{{m}}}) < {size}",
        "5m",
    ),
    Alert(
        "VnetdNoFreshHandshake",
        "Peers are configured but none has shaken hands within 3 minutes.",
        "vnetd_peers_configured{{{m}}} > 0 and vnetd_peers_handshake_fresh{{{m}}} == 0",
        "5m",
    ),
    Alert(
        "VnetdPeerSilent",
        "One peer has been silent for 10 minutes (only meaningful with traffic or a keepalive).",
        "vnetd_peer_last_handshake_seconds{{{m}}} > 600",
        severity="info",
    ),
    Alert(
        "VnetdRegistryErrors",
        "The registry keeps failing.",
        "sum by (namespace, pod, operation) (rate(vnetd_registry_errors_total{{{m}}}[5m])) > 0.1",
        "10m",
    ),
    Alert(
        "VnetdRegistryGarbage",
        "Garbage is being written under the mesh prefix.",
        "increase(vnetd_registry_bad_entries_total{{{m}}}[15m]) > 0",
    ),
    Alert(
        "VnetdWireguardCrashLoop",
        "wireguard-go is crash-looping.",
        "increase(vnetd_wireguard_restarts_total{{{m}}}[15m]) > 3",
        severity="critical",
    ),
)


def promql_block(spec: MeshSpec) -> str:
    """The alerts as ``docs/operations.md`` shows them: a comment, then the expression."""
    lines = []
    for alert in ALERTS:
        lines.append(f"# {alert.name}: {alert.summary}")
        held = f"    # for: {alert.duration}" if alert.duration else ""
        lines.append(f"{alert.promql(spec)}{held}")
        lines.append("")
    return "\n".join(lines[:-1]) + "\n"


def check_expected_ranks(spec: MeshSpec, expected: int | None) -> int:
    """How many ranks ``VnetdRankMissing`` expects: ``--expected-ranks``, else every rank.

    Raises:
        SpecError: not within 1 .. mesh.size (the flag named).
    """
    if expected is None:
        return spec.size
    if not 1 <= expected <= spec.size:
        raise SpecError(
            f"--expected-ranks: {expected} is not within 1..{spec.size} (mesh.size); give "
            "how many ranks should be up, e.g. the DaemonSet's desired number of nodes"
        )
    return expected


def render_monitoring(
    spec: MeshSpec, expected: int | None = None, minicluster: bool = False
) -> str:
    """The PodMonitor and the PrometheusRule of ``spec`` as a YAML stream; ``expected``
    ranks registered (default: every rank) keep ``VnetdRankMissing`` quiet;
    ``minicluster``: the pods are a Flux Operator MiniCluster's.

    Raises:
        SpecError: ``expected`` is out of range (``check_expected_ranks``), or the HTTP
            port is 0 (``http_port``).
    """
    expected = check_expected_ranks(spec, expected)
    header = manifest_objects_header(
        spec, "monitoring", "vnetd render monitoring", "the mesh's spec"
    )
    monitor = _minicluster_monitor(spec) if minicluster else _pod_monitor(spec)
    return header + yaml_stream([monitor, _rule(spec, expected)])


def _selector(spec: MeshSpec) -> Obj:
    return {"app.kubernetes.io/name": "vnetd", "app.kubernetes.io/instance": spec.name}


MESH_LABEL = {
    "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
    "targetLabel": "mesh",
}


def _pod_monitor(spec: MeshSpec) -> Obj:
    endpoint = {"port": "vnetd-http", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                "relabelings": [MESH_LABEL]}  # fmt: skip
    return _monitor(spec, _selector(spec), endpoint)


def _minicluster_monitor(spec: MeshSpec) -> Obj:
    """Prometheus makes a port-free target of each container that declares no port; keep
    the vnetd container's and give it the pod's address and vnetd's HTTP port."""
    port = http_port(spec)
    relabelings = [
        {"sourceLabels": ["__meta_kubernetes_pod_container_name"], "regex": VNETD_CONTAINER,
         "action": "keep"},
        {"sourceLabels": ["__meta_kubernetes_pod_ip"], "regex": "([^:]+)",
         "targetLabel": "__address__", "replacement": f"${{1}}:{port}"},
        {"sourceLabels": ["__meta_kubernetes_pod_ip"], "regex": "(.+:.+)",
         "targetLabel": "__address__", "replacement": f"[${{1}}]:{port}"},
        MESH_LABEL,
    ]  # fmt: skip
    endpoint = {"path": "/metrics", "interval": SCRAPE_INTERVAL, "relabelings": relabelings}
    return _monitor(spec, pod_selector(spec), endpoint)


def _monitor(spec: MeshSpec, selector: Obj, endpoint: Obj) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": {"name": config_name(spec), "labels": labels(spec, "monitoring")},
        "spec": {"selector": {"matchLabels": selector}, "podMetricsEndpoints": [endpoint]},
    }


def _rule(spec: MeshSpec, expected: int) -> Obj:
    rules = []
    for alert in ALERTS:
        rule: Obj = {"alert": alert.name, "expr": alert.promql(spec, expected)}
        if alert.duration:
            rule["for"] = alert.duration
        rule["labels"] = {"severity": alert.severity, "mesh": spec.name}
        rule["annotations"] = {
            "summary": alert.summary,
            "description": f"mesh {spec.name}: see docs/operations.md, metrics and alerts.",
        }
        rules.append(rule)
    return {
        "apiVersion": API_VERSION,
        "kind": "PrometheusRule",
        "metadata": {"name": config_name(spec), "labels": labels(spec, "monitoring")},
        "spec": {"groups": [{"name": f"vnetd-{spec.name}", "rules": rules}]},
    }
