"""``vnetd render minicluster``'s sizes and batch mode, against each version's stored CRD.

``size`` and ``maxSize`` mean what the operator's sources make of them (read at
both pinned versions: ``controllers/flux/job.go``, ``scale.go``,
``pkg/flux/config.go``, ``view.go``): ``size`` is the Indexed Job's
completions and parallelism, ``maxSize`` bounds a resize and is the host list
R is encoded for; ``maxSize > size`` makes ``wait.sh`` start the brokers with
``broker.quorum = size``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schemas import validate_crd

from vnetd.errors import SpecError
from vnetd.render.minicluster import MiniClusterOptions, render_minicluster
from vnetd.render.operator_versions import OPERATOR_VERSIONS
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[3]
SIDECAR_SPEC = ROOT / "manifests" / "sidecar" / "mesh.toml"
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"
VERSIONS = list(OPERATOR_VERSIONS)


def docs_of(options: MiniClusterOptions) -> dict[str, list[dict[str, Any]]]:
    text = render_minicluster(load_spec(SIDECAR_SPEC), SIDECAR_SPEC.read_text(), options)
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(text):
        found.setdefault(doc["kind"], []).append(doc)
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_max_size_is_every_rank_and_size_the_pods_it_starts_with(version: str):
    spec = load_spec(SIDECAR_SPEC)
    whole = docs_of(MiniClusterOptions(image=IMAGE, operator_version=version))
    (minicluster,) = whole["MiniCluster"]
    body = minicluster["spec"]
    assert (body["size"], body["maxSize"], body["tasks"]) == (spec.size,) * 3
    validate_crd(minicluster, f"minicluster-{version}")

    grown = docs_of(MiniClusterOptions(image=IMAGE, operator_version=version, size=2))
    (minicluster,) = grown["MiniCluster"]
    body = minicluster["spec"]
    # The operator's quorum is then size (getRequiredRanks), and R names maxSize hosts.
    assert (body["size"], body["maxSize"], body["tasks"]) == (2, spec.size, 2)
    (budget,) = grown["PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 2, "a budget of absent pods would block drains"
    # The bootstrap already names every rank up to maxSize: a scaled-in pod has its address.
    hosts = tomllib.loads(body["flux"]["brokerConfig"])["bootstrap"]["hosts"]
    assert len(hosts) == body["maxSize"]
    validate_crd(minicluster, f"minicluster-{version}")


@pytest.mark.parametrize("size", [0, 5])
def test_a_size_outside_the_mesh_is_refused(size: int):
    with pytest.raises(SpecError, match=rf"--size: {size} is not a number of pods .* 1 to 4"):
        docs_of(MiniClusterOptions(image=IMAGE, size=size))


@pytest.mark.parametrize("version", VERSIONS)
def test_batch_mode_nests_its_instance_on_the_overlay(version: str):
    """The operator's batch mode runs ``flux batch``: a nested instance bootstrapped by PMI,
    whose brokers bind where ``tbon.interface-hint`` points, inherited from this instance's
    config (flux-config-tbon(5)); without it, the default route's address, the pod network,
    which a default-deny namespace closes to TCP."""
    spec = load_spec(SIDECAR_SPEC)
    (minicluster,) = docs_of(
        MiniClusterOptions(
            image=IMAGE, operator_version=version, batch=True, command="./step-1\n./step-2"
        )  # fmt: skip
    )["MiniCluster"]
    flux = minicluster["spec"]["containers"][0]
    assert flux["batch"] is True and flux["command"] == "./step-1\n./step-2"
    config = tomllib.loads(minicluster["spec"]["flux"]["brokerConfig"])
    assert config["tbon"] == {"interface-hint": spec.interface}
    validate_crd(minicluster, f"minicluster-{version}")
    (plain,) = docs_of(MiniClusterOptions(image=IMAGE, operator_version=version))["MiniCluster"]
    assert "batch" not in plain["spec"]["containers"][0]
    # The hint is there in every mode: a user's own `flux batch` or `flux alloc` nests too.
    assert tomllib.loads(plain["spec"]["flux"]["brokerConfig"])["tbon"] == config["tbon"]
