"""Each fact of ``vnetd/render/operator_versions.py`` against the source of the version it
names: the operator's own files in ``operator/<version>/`` and its CRD in ``crds/``."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from vnetd.render.flux import FluxOptions, render_flux
from vnetd.render.minicluster import broker_config
from vnetd.render.operator_versions import OPERATOR_VERSIONS, VIEW, OperatorVersion
from vnetd.spec import load_spec

HERE = Path(__file__).parent
SIDECAR_SPEC = HERE.parents[2] / "manifests" / "sidecar" / "mesh.toml"
VERSIONS = [pytest.param(v, id=v.name) for v in OPERATOR_VERSIONS.values()]


def source(version: OperatorVersion, name: str) -> str:
    return (HERE / "operator" / version.name / name).read_text()


def crd_text(version: OperatorVersion) -> str:
    """The stored CRD without the header comment that says where it came from."""
    lines = (HERE / "crds" / f"minicluster-{version.name}.yaml").read_text().splitlines(True)
    while lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def spec_schema(version: OperatorVersion) -> dict[str, object]:
    (crd_version,) = yaml.safe_load(crd_text(version))["spec"]["versions"]
    spec: dict[str, object] = crd_version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


@pytest.mark.parametrize("version", VERSIONS)
def test_the_stored_crd_is_the_versions_own(version: OperatorVersion):
    digest = hashlib.sha256(crd_text(version).encode()).hexdigest()
    assert digest == version.crd_sha256
    header = (HERE / "crds" / f"minicluster-{version.name}.yaml").read_text().split("\n", 1)[0]
    assert version.commit in header


@pytest.mark.parametrize("version", VERSIONS)
def test_the_install_names_the_version(version: OperatorVersion):
    if version.controller_image is None:
        assert version.commit in version.install, "the branch's YAML runs :latest"
    else:
        assert f"/download/{version.name}/" in version.install
        assert version.controller_image.endswith(f":v{version.name}")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_script_facts(version: OperatorVersion):
    start, wait = source(version, "start.sh"), source(version, "wait.sh")
    # A non-Flux container's command is one line of start.sh, after the socket wait.
    lines = start.splitlines()
    assert lines.count(version.command_line) == 1
    assert start.index(version.command_line) > start.index(".Spec.Flux.NoWaitSocket") > 0
    # The marker vnetd exits on: wait.sh's last line, reached once the broker has exited.
    marker = version.marker.replace("/mnt/flux", "$viewbase")
    assert wait.rstrip().splitlines()[-1] == f"touch {marker}"
    # The CURVE certificate's copy, relative to the view.
    root = "configroot" if "/config/" in version.curve_cert else "viewroot"
    assert f"curvepath=${root}/curve/curve.cert" in wait
    assert version.config_root.endswith("/config" if root == "configroot" else "/view")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_view_image_and_the_spec_fields(version: OperatorVersion):
    spec = spec_schema(version)
    props = spec["properties"]
    assert isinstance(props, dict)
    view = props["flux"]["properties"]["container"]["properties"]["image"]
    assert view["default"] == version.view_image
    distribution = "ubuntu" if "ubuntu" in version.view_image else "rocky"
    assert distribution in version.app_image, "the application runs the view's distribution"
    assert props["deadlineSeconds"]["default"] == 31_500_000
    assert ("backoffLimit" in props) is version.backoff_limit
    security = props["containers"]["items"]["properties"]["securityContext"]["properties"]
    assert ("runAsUser" in security) is version.core_security_context


@pytest.mark.parametrize("version", VERSIONS)
def test_the_job_facts(version: OperatorVersion):
    job = source(version, "job.go")
    assert "ActiveDeadlineSeconds: &cluster.Spec.DeadlineSeconds" in job
    assert "RestartPolicy:                corev1.RestartPolicyOnFailure" in job
    assert "backoffLimit := int32(100)" in job
    settable = "backoffLimit = cluster.Spec.BackoffLimit" in job
    assert settable is version.backoff_limit
    if settable:  # 0 is "unset": the operator's 100
        assert re.search(r"if cluster\.Spec\.BackoffLimit != 0 \{\s*backoffLimit =", job)
    assert "Annotations: cluster.Spec.Pod.Annotations" in job


def operators_own_config(version: OperatorVersion, queue_policy: str) -> dict[str, Any]:
    """What ``generateBrokerConfig`` (view.go) writes for a MiniCluster given no broker
    config: its template with its ``Sprintf`` arguments in their order."""
    view = source(version, "view.go")
    template = view.split("template := `", 1)[1].split("`", 1)[0]
    assert template.count("%s") == 7
    host_block = 'hosts = [\n{ host="flux-sample-[0-3]"},\n]\t\t\n'
    connect = "tcp://%h.flux-sample.default.svc.cluster.local:%p"
    arguments = (VIEW, VIEW, "tcp://eth0:%p", connect, host_block, VIEW, queue_policy)
    text = template.replace("%s", "{}").format(*arguments)
    config: dict[str, Any] = tomllib.loads(text)
    return config


@pytest.mark.parametrize("queue_policy", ["fcfs", "easy"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_broker_config_is_the_operators_with_vnetds_bootstrap(
    version: OperatorVersion, queue_policy: str
):
    spec = load_spec(SIDECAR_SPEC)
    text = broker_config(spec, version.name, queue_policy)
    ours, theirs = tomllib.loads(text), operators_own_config(version, queue_policy)
    bootstrap = render_flux(spec, FluxOptions(curve_cert=version.curve_cert))
    assert ours.pop("bootstrap") == tomllib.loads(bootstrap)["bootstrap"]
    assert theirs.pop("bootstrap")["curve_cert"] == version.curve_cert
    assert ours == theirs, "resource, access, archive and the queue policy as it writes them"
    assert ours["sched-fluxion-qmanager"] == {"queue-policy": queue_policy}
    # view.go writes it through an unquoted here-document: nothing the shell expands.
    assert "cat <<EOT >>" in source(version, "view.go")
    assert not set(text) & {"$", "`", "\\"}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_declared_port_makes_a_service_named_after_its_container(version: OperatorVersion):
    """Why the vnetd container declares no port: one Service per container name and
    namespace, selecting the first MiniCluster's pods (monitoring.py, docs/flux.md)."""
    reconcile = source(version, "minicluster.go")
    assert "if container.RunFlux || len(container.Ports) == 0 {" in reconcile
    assert "selector := map[string]string{podLabelAppName: cluster.Name}" in reconcile
    assert "r.exposeService(ctx, cluster, container.Name, selector, container.Ports)" in reconcile
    pods = source(version, "pods.go")
    assert "podLabels := cluster.Spec.Pod.Labels" in pods, "spec.pod.labels are kept"
    assert "podLabels[podLabelAppName] = cluster.Name" in pods, "name is overwritten"
