"""``vnetd render monitoring``: a PodMonitor and a PrometheusRule that fit the Prometheus
Operator's v1 API, select the rendered pods, and hold the alerts docs/operations.md shows."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_schemas import validate_custom
from kubernetes_validate.utils import latest_version, major_minor

from vnetd.cli import main
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.render.monitoring import ALERTS, promql_block, render_monitoring
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[3]
BASES = {"sidecar": ROOT / "manifests/sidecar/mesh.toml", "daemonset": ROOT / "manifests/daemonset/mesh.toml"}  # fmt: skip
VERSIONS = sorted({"1.29", major_minor(latest_version())})
SCHEMAS = {"PodMonitor": "podmonitor-monitoring-v1", "PrometheusRule": "prometheusrule-monitoring-v1"}  # fmt: skip


def rendered(path: Path) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(render_monitoring(load_spec(path))))
    return {doc["kind"]: doc for doc in docs}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("base", sorted(BASES))
def test_objects_fit_the_monitoring_v1_schemas(base: str, version: str):
    for kind, doc in rendered(BASES[base]).items():
        validate_custom(doc, SCHEMAS[kind], version)


def test_schemas_catch_errors():
    objs = rendered(BASES["sidecar"])
    objs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="'intervall' was unexpected"):
        validate_custom(objs["PodMonitor"], SCHEMAS["PodMonitor"], VERSIONS[0])
    objs["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        validate_custom(objs["PrometheusRule"], SCHEMAS["PrometheusRule"], VERSIONS[0])


@pytest.mark.parametrize("mode", ["sidecar", "daemonset"])
def test_pod_monitor_selects_the_rendered_pods_and_their_port(mode: str):
    path = BASES[mode]
    monitor = rendered(path)["PodMonitor"]["spec"]
    docs = yaml.safe_load_all(
        render_manifests(load_spec(path), path.read_text(), ManifestOptions(mode=mode))
    )
    workload = next(d for d in docs if d["kind"] in {"Job", "DaemonSet"})
    template = workload["spec"]["template"]
    assert monitor["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    ports = {p["name"] for c in pod.get("initContainers", []) + pod["containers"]
             for p in c.get("ports", [])}  # fmt: skip
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    (relabel,) = endpoint["relabelings"]
    key = "app.kubernetes.io/instance"
    assert relabel["sourceLabels"] == [
        "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
    ]
    assert relabel["targetLabel"] == "mesh" and template["metadata"]["labels"][key]


def test_rules_are_the_documented_alerts():
    """docs/operations.md shows promql_block of the DaemonSet base: the same alerts."""
    text = (ROOT / "docs" / "operations.md").read_text()
    (block,) = re.findall(r"```promql\n(.*?)```", text, flags=re.S)
    spec = load_spec(BASES["daemonset"])
    assert block == promql_block(spec)
    (group,) = rendered(BASES["daemonset"])["PrometheusRule"]["spec"]["groups"]
    assert [r["alert"] for r in group["rules"]] == [a.name for a in ALERTS]
    for rule, alert in zip(group["rules"], ALERTS, strict=True):
        assert rule["expr"] in block and rule.get("for") == alert.duration
        assert rule["labels"]["mesh"] == spec.name
    assert group["rules"][0]["expr"].endswith(f"< {spec.size}"), "the threshold is mesh.size"


def test_promtool_accepts_the_rules(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool is not installed: the rules were checked against the schema only")
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    for base, path in BASES.items():
        rules = tmp_path / f"{base}.yaml"
        rules.write_text(yaml.safe_dump(rendered(path)["PrometheusRule"]["spec"]))
        result = subprocess.run(
            [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    target = tmp_path / "monitoring.yaml"
    assert main(["render", "monitoring", "--config", str(BASES["sidecar"]), "-o", str(target)]) == 0
    assert capsys.readouterr() == ("", "")
    assert target.read_text() == render_monitoring(load_spec(BASES["sidecar"]))


def test_expected_ranks_sets_the_rank_missing_threshold(capsys: pytest.CaptureFixture[str]):
    """A DaemonSet on 12 labelled nodes of a 64-rank mesh: the alert compares with 12,
    not 64 (which would fire for ever)."""
    config = str(BASES["daemonset"])
    assert main(["render", "monitoring", "--config", config, "--expected-ranks", "12"]) == 0
    out, err = capsys.readouterr()
    rules = {r["alert"]: r for d in yaml.safe_load_all(out) if d["kind"] == "PrometheusRule"
             for r in d["spec"]["groups"][0]["rules"]}  # fmt: skip
    assert rules["VnetdRankMissing"]["expr"].endswith(") < 12"), rules["VnetdRankMissing"]
    assert err == ""
    assert main(["render", "monitoring", "--config", config, "--expected-ranks", "65"]) == 2
    out, err = capsys.readouterr()
    assert err == (
        "vnetd: error: --expected-ranks: 65 is not within 1..64 (mesh.size); give how many "
        "ranks should be up, e.g. the DaemonSet's desired number of nodes\n"
    )


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' ``keep`` and ``replace`` (anchored regex; no match: no change)."""
    labels = dict(labels)
    for rule in rules:
        value = ";".join(labels.get(name, "") for name in rule["sourceLabels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace") == "keep":
            if match is None:
                return None
        elif match is not None:
            replacement = rule.get("replacement", "$1").replace("${1}", r"\1").replace("$1", r"\1")
            labels[rule["targetLabel"]] = match.expand(replacement)
    return labels


def scraped(monitor: dict[str, Any], pod_labels: dict[str, str], pod_ip: str) -> list[str]:
    """The addresses Prometheus scrapes for a MiniCluster pod as the operator writes it:
    no container declares a port, so pod discovery makes one port-free target per
    container (the view's init container, the Flux container, vnetd)."""
    spec = monitor["spec"]
    if not spec["selector"]["matchLabels"].items() <= pod_labels.items():
        return []
    (endpoint,) = spec["podMetricsEndpoints"]
    assert "port" not in endpoint and "portNumber" not in endpoint, "they keep declared ports"
    addresses = []
    for container in ("flux-view", pod_labels["app.kubernetes.io/name"], "vnetd"):
        meta = {"__address__": pod_ip, "__meta_kubernetes_pod_ip": pod_ip,
                "__meta_kubernetes_pod_container_name": container}  # fmt: skip
        meta |= {f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
                 for k, v in pod_labels.items()}  # fmt: skip
        target = relabel(meta, endpoint["relabelings"])
        if target is not None:
            assert target["mesh"] == pod_labels["app.kubernetes.io/instance"]
            addresses.append(target["__address__"])
    return addresses


@pytest.mark.parametrize("version", VERSIONS)
def test_minicluster_pod_monitor_scrapes_vnetd_on_the_pods_the_operator_makes(version: str):
    from vnetd.render.minicluster import MiniClusterOptions, render_minicluster

    path = BASES["sidecar"]
    spec = load_spec(path)
    docs = yaml.safe_load_all(render_monitoring(spec, minicluster=True))
    monitor = {d["kind"]: d for d in docs}["PodMonitor"]
    validate_custom(monitor, SCHEMAS["PodMonitor"], version)
    minicluster = next(
        d for d in yaml.safe_load_all(render_minicluster(spec, path.read_text(),
                                                          MiniClusterOptions()))
        if d["kind"] == "MiniCluster"
    )  # fmt: skip
    # The operator keeps spec.pod.labels and overwrites app.kubernetes.io/name (pods.go).
    name = minicluster["metadata"]["name"]
    pod = {**minicluster["spec"]["pod"]["labels"], "app": "flux-operator",
           "app.kubernetes.io/name": name, "namespace": "flux-sample"}  # fmt: skip
    assert scraped(monitor, pod, "10.8.0.5") == ["10.8.0.5:9090"]
    assert scraped(monitor, pod, "fd00:8::5") == ["[fd00:8::5]:9090"]
    # No container declares a port: the operator makes no Service of it (minicluster.go).
    assert all("ports" not in c for c in minicluster["spec"]["containers"])
    # The sidecar's and DaemonSet's PodMonitor would find nothing here.
    sidecar = {d["kind"]: d for d in yaml.safe_load_all(render_monitoring(spec))}
    assert scraped(sidecar["PodMonitor"], pod, "10.8.0.5") == []
