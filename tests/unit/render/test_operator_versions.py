"""The facts of ``vnetd/render/operator_versions.py`` that the version's stored MiniCluster
CRD (``crds/``) carries, and the broker config's shape. The facts read from the operator's
scripts and Go source are checked against a clone of it by
``scripts/check_operator_facts.py`` (its code is not copied here)."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest
import yaml

from vnetd.render.flux import FluxOptions, render_flux
from vnetd.render.minicluster import broker_config
from vnetd.render.operator_versions import OPERATOR_VERSIONS, OperatorVersion
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


@pytest.mark.parametrize("queue_policy", ["fcfs", "easy"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_broker_config_is_the_operators_with_vnetds_bootstrap(
    version: OperatorVersion, queue_policy: str
):
    """vnetd's [bootstrap] in the operator's config: its sections stay (their values as the
    operator writes them are checked against its view.go by scripts/check_operator_facts.py)."""
    spec = load_spec(SIDECAR_SPEC)
    text = broker_config(spec, version.name, queue_policy)
    ours = tomllib.loads(text)
    bootstrap = render_flux(spec, FluxOptions(curve_cert=version.curve_cert))
    assert ours.pop("bootstrap") == tomllib.loads(bootstrap)["bootstrap"]
    assert {"access", "resource", "archive", "sched-fluxion-qmanager"} <= ours.keys()
    assert ours["sched-fluxion-qmanager"] == {"queue-policy": queue_policy}
    assert str(ours["resource"]["path"]).startswith(version.config_root)
    assert not set(text) & {"$", "`", "\\"}  # written through an unquoted here-document
