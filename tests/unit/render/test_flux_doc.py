"""``docs/flux.md`` section 5, the walk-through to a completed MiniCluster, run where it can be.

Its ``vnetd`` command runs (writing into a temporary directory) and its output
validates against the MiniCluster CRD of the operator version it targets; its
``-k`` directory builds with ``kubectl kustomize``; every ``kubectl`` command
line parses with ``kubectl`` itself (``--help`` rejects unknown subcommands
and flags without a cluster); the steps come in order and name what the
render uses (the namespace, the Job, the containers, the operator's URL).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from crd_schemas import validate_crd

from vnetd.cli import main
from vnetd.render.operator_versions import DEFAULT_OPERATOR_VERSION, OPERATOR_VERSIONS
from vnetd.render.pods import ETCD_CLIENT_SECRET
from vnetd.render.secretfiles import ETCD_PASSWORD_SECRET, PRESHARED_KEY_SECRET

ROOT = Path(__file__).parents[3]
DOC = ROOT / "docs" / "flux.md"
NAMESPACE = "flux-sample"


def section() -> str:
    text = DOC.read_text()
    return text.split("\n## 5. ", 1)[1].split("\n## ", 1)[0]


def commands() -> list[str]:
    (block,) = re.findall(r"```sh\n(.*?)```", section(), flags=re.S)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_steps_come_in_order():
    steps = [
        "docker build -t registry.example.org/flux-operator:",
        "kubectl apply -f https://raw.githubusercontent.com/flux-framework/flux-operator/",
        "set image deployment/operator-controller-manager manager=",
        f"kubectl create namespace {NAMESPACE}",
        "pod-security.kubernetes.io/enforce=privileged",
        f"kubectl -n {NAMESPACE} apply -k manifests/overlays/etcd",
        "rollout status statefulset/etcd",
        "vnetd render minicluster",
        f"kubectl -n {NAMESPACE} apply -f minicluster.yaml",
        "wait --for=create job/",
        "wait --for=condition=complete job/",
        "logs -l batch.kubernetes.io/job-completion-index=0 -c ",
        "delete minicluster ",
        "delete poddisruptionbudget,configmap,networkpolicy -l ",
    ]
    found = [next(i for i, c in enumerate(commands()) if words in c) for words in steps]
    text = section()
    assert found == sorted(found), "the steps are out of order"
    version = OPERATOR_VERSIONS[DEFAULT_OPERATOR_VERSION]
    assert version.controller_image is None, "the commit's controller is built from it"
    assert f"kubectl apply -f {version.install}" in commands(), "the pinned install YAML"
    (build,) = [c for c in commands() if c.startswith("docker build ")]
    assert build.endswith(f"flux-operator.git#{version.commit}"), "built from the commit"
    image = shlex.split(build)[shlex.split(build).index("-t") + 1]
    assert any(c.endswith(f"manager={image}") for c in commands()), "and set on the controller"
    release = OPERATOR_VERSIONS["0.2.1"]
    assert release.install in text and f"--operator-version {release.name}" in text
    for name in (ETCD_CLIENT_SECRET, PRESHARED_KEY_SECRET, ETCD_PASSWORD_SECRET):
        assert name in text, name


def test_the_render_command_runs_and_its_output_fits_the_crd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    (command,) = [c for c in commands() if c.startswith("vnetd ")]
    argv = shlex.split(command)[1:]
    output = argv.index("-o") + 1
    argv[output] = str(tmp_path / argv[output])
    argv = [str(ROOT / a) if a.startswith("manifests/") else a for a in argv]
    assert main(argv) == 0
    capsys.readouterr()
    docs = list(yaml.safe_load_all(Path(argv[output]).read_text()))
    (minicluster,) = [d for d in docs if d["kind"] == "MiniCluster"]
    validate_crd(minicluster, f"minicluster-{DEFAULT_OPERATOR_VERSION}")
    name = minicluster["metadata"]["name"]
    # The wait and the logs name what the operator makes of it.
    assert f"job/{name} " in " ".join(commands()) + " "
    logs = [shlex.split(c) for c in commands() if " logs " in c]
    containers = {words[words.index("-c") + 1] for words in logs}
    assert containers == {name, "vnetd"}, "the Flux container is named after the MiniCluster"
    assert any(c.get("name") == "vnetd" for c in minicluster["spec"]["containers"])


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        print("kubectl is not installed: its commands were not checked")
        pytest.skip("kubectl is not installed")
    return found


def test_the_kustomization_builds():
    (command,) = [c for c in commands() if " -k " in c]
    directory = shlex.split(command)[shlex.split(command).index("-k") + 1]
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / directory)], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout)}
    assert {"StatefulSet", "NetworkPolicy", "Certificate"} <= kinds, kinds
    assert "Namespace" not in kinds, "the namespace is the walk-through's own"


@pytest.mark.parametrize("command", [c for c in commands() if c.startswith("kubectl ")])
def test_kubectl_commands_parse(command: str):
    words = shlex.split(command)
    result = subprocess.run(
        [kubectl(), *words[1:], "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{command}: {result.stderr.strip()}"


def test_the_cleanup_selects_every_object_of_the_render_but_the_minicluster(tmp_path: Path):
    """No owner reference can be rendered (the MiniCluster's UID does not exist yet): the
    documented ``delete -l`` removes the rest, and nothing of etcd's."""
    (command,) = [c for c in commands() if " -l " in c and " delete " in c]
    words = shlex.split(command)
    kinds = {"poddisruptionbudget": "PodDisruptionBudget", "configmap": "ConfigMap",
             "networkpolicy": "NetworkPolicy"}  # fmt: skip
    assert words[words.index("delete") + 1].split(",") == list(kinds)
    selector = dict(pair.split("=") for pair in words[words.index("-l") + 1].split(","))
    spec = ROOT / "manifests" / "sidecar" / "mesh.toml"
    output = tmp_path / "minicluster.yaml"
    argv = ["render", "minicluster", "--config", str(spec), "--mesh-policy", "-o", str(output)]
    assert main(argv) == 0
    rendered = {doc["kind"]: doc for doc in yaml.safe_load_all(output.read_text())}
    assert set(rendered) == {"MiniCluster", *kinds.values()}, "the MiniCluster: by name"
    for kind in kinds.values():
        assert selector.items() <= rendered[kind]["metadata"]["labels"].items(), kind
    for path in (ROOT / "manifests" / "etcd").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            labels = (doc or {}).get("metadata", {}).get("labels", {})
            assert not selector.items() <= labels.items(), path


def test_the_kubectl_named_waits_for_creation():
    """``kubectl wait --for=create`` came in kubectl 1.31: the one here has it."""
    result = subprocess.run(
        [kubectl(), "wait", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--for=create" in result.stdout
    assert "kubectl\n   1.31 or later" in section() or "kubectl 1.31 or later" in " ".join(
        section().split()
    )
