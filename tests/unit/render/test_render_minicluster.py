"""``vnetd render minicluster``: the MiniCluster fits the Flux Operator's CRD of each
supported version (``crds/``, copied from the operator), its broker config is ``vnetd
render flux``'s, vnetd runs beside Flux and ends with the job, etcd's NetworkPolicy admits
the pods as the operator labels them, and Secrets the spec names are mounted."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_schemas import validate_crd
from render_fixtures import EXAMPLE, LAB6_TOML

from vnetd.cli import build_parser, main
from vnetd.errors import SpecError
from vnetd.render.minicluster import (
    BACKOFF_LIMIT,
    DEFAULT_DEADLINE,
    OPERATOR_CURVE_CERT,
    OPERATOR_MARKER,
    MiniClusterOptions,
    broker_config,
    render_minicluster,
)
from vnetd.render.operator_versions import DEFAULT_OPERATOR_VERSION, OPERATOR_VERSIONS
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[3]
SIDECAR_SPEC = ROOT / "manifests" / "sidecar" / "mesh.toml"
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"
VERSIONS = list(OPERATOR_VERSIONS)


def rendered(path: Path, options: MiniClusterOptions | None = None) -> list[dict[str, Any]]:
    text = render_minicluster(load_spec(path), path.read_text(), options)
    return list(yaml.safe_load_all(text))


def minicluster_of(path: Path, version: str = DEFAULT_OPERATOR_VERSION) -> dict[str, Any]:
    docs = rendered(path, MiniClusterOptions(image=IMAGE, operator_version=version))
    config_map, minicluster, budget = docs
    assert config_map["kind"] == "ConfigMap" and minicluster["kind"] == "MiniCluster"
    assert budget["kind"] == "PodDisruptionBudget"
    return minicluster


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", [SIDECAR_SPEC, EXAMPLE], ids=["sidecar-spec", "example"])
def test_minicluster_fits_the_crd_of_its_operator_version(path: Path, version: str):
    validate_crd(minicluster_of(path, version), f"minicluster-{version}")


def test_each_version_needs_its_own_render():
    """0.2.1's securityContext is the operator's own {privileged, addCapabilities};
    main's is Kubernetes'. Each render fails the other version's CRD."""
    with pytest.raises(jsonschema.ValidationError, match="'runAsUser'.* unexpected"):
        validate_crd(minicluster_of(SIDECAR_SPEC, DEFAULT_OPERATOR_VERSION), "minicluster-0.2.1")
    with pytest.raises(jsonschema.ValidationError, match="'addCapabilities' was unexpected"):
        validate_crd(
            minicluster_of(SIDECAR_SPEC, "0.2.1"), f"minicluster-{DEFAULT_OPERATOR_VERSION}"
        )
    old = minicluster_of(SIDECAR_SPEC, "0.2.1")
    assert "/mnt/flux/view/curve/curve.cert" in old["spec"]["flux"]["brokerConfig"]
    assert old["spec"]["containers"][1]["securityContext"] == {"addCapabilities": ["NET_ADMIN"]}
    assert OPERATOR_CURVE_CERT == "/mnt/flux/config/curve/curve.cert"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_job_is_bounded_by_a_deadline_and_fails_at_its_first_restart(version: str):
    """``deadlineSeconds`` becomes the Job's ``activeDeadlineSeconds`` (both versions'
    job.go, checked in test_operator_versions); ``backoffLimit`` exists only at the commit."""
    body = minicluster_of(SIDECAR_SPEC, version)["spec"]
    assert body["deadlineSeconds"] == DEFAULT_DEADLINE < 31_500_000, "not the operator's year"
    options = MiniClusterOptions(image=IMAGE, operator_version=version, deadline=600)
    _, minicluster, _ = rendered(SIDECAR_SPEC, options)
    assert minicluster["spec"]["deadlineSeconds"] == 600
    validate_crd(minicluster, f"minicluster-{version}")
    if OPERATOR_VERSIONS[version].backoff_limit:
        assert body["backoffLimit"] == BACKOFF_LIMIT == 1
    else:
        assert "backoffLimit" not in body
        with pytest.raises(jsonschema.ValidationError, match="'backoffLimit' was unexpected"):
            validate_crd(
                {**minicluster, "spec": {**body, "backoffLimit": 1}}, f"minicluster-{version}"
            )


@pytest.mark.parametrize("version", VERSIONS)
def test_the_crd_catches_unknown_fields_and_wrong_types(version: str):
    crd = f"minicluster-{version}"
    minicluster = minicluster_of(SIDECAR_SPEC, version)
    minicluster["spec"]["flux"]["brokerconfig"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="'brokerconfig' was unexpected"):
        validate_crd(minicluster, crd)
    minicluster = minicluster_of(SIDECAR_SPEC, version)
    minicluster["spec"]["size"] = "4"
    with pytest.raises(jsonschema.ValidationError, match="'4' is not of type 'integer'"):
        validate_crd(minicluster, crd)
    minicluster = minicluster_of(SIDECAR_SPEC, version)
    minicluster["spec"]["pod"]["labels"]["n"] = 1
    with pytest.raises(jsonschema.ValidationError, match="1 is not of type 'string'"):
        validate_crd(minicluster, crd)


def test_broker_config_holds_what_render_flux_writes(capsys: pytest.CaptureFixture[str]):
    minicluster = minicluster_of(SIDECAR_SPEC)
    argv = ["render", "flux", "--config", str(SIDECAR_SPEC), "--curve-cert", OPERATOR_CURVE_CERT]
    assert main(argv) == 0
    flux_output = capsys.readouterr().out
    config = minicluster["spec"]["flux"]["brokerConfig"]
    assert f"\n\n{flux_output}\n" in config and config == broker_config(load_spec(SIDECAR_SPEC))
    assert 'connect = "tcp://10.250.0.1:8050"' in flux_output, "fixed overlay addresses"
    # The queue policy is the operator's default, in the config and the MiniCluster alike.
    assert 'queue-policy = "fcfs"' in config
    assert minicluster["spec"]["flux"]["scheduler"] == {"queuePolicy": "fcfs"}


def test_pods_are_named_like_the_spec_hosts_and_vnetd_runs_beside_flux():
    spec = load_spec(SIDECAR_SPEC)
    config_map, minicluster, _ = rendered(SIDECAR_SPEC, MiniClusterOptions(image=IMAGE))
    assert config_map["data"] == {"mesh.toml": SIDECAR_SPEC.read_text()}
    # The operator's Indexed Job is named after the MiniCluster: hosts <name>-<index>.
    name = minicluster["metadata"]["name"]
    assert [f"{name}-{r}" for r in range(spec.size)] == [spec.host(r) for r in range(spec.size)]
    body = minicluster["spec"]
    assert body["size"] == spec.size
    # The operator's sidecar script waits for Flux's socket unless told not to; Flux
    # waits for vnetd, so that wait would never end.
    assert body["flux"]["noWaitSocket"] is True
    flux, vnetd = body["containers"]
    assert flux["runFlux"] is True and "name" not in flux
    assert "/dev/tcp/127.0.0.1/9090" in flux["commands"]["pre"]
    assert "exit 1" in flux["commands"]["pre"], "the wait is bounded"
    assert vnetd["name"] == "vnetd" and vnetd["image"] == IMAGE
    # The spec's etcd password file is copied out of its 0644 Secret mount first.
    assert vnetd["command"].startswith("unset PYTHONPATH; ")
    setup, _, run = vnetd["command"].rpartition("exec ")
    assert "install -D -m 0400 " in setup and str(spec.registry.password_file) in setup
    argv = shlex.split(run)
    assert argv[0] == "vnetd"
    build_parser().parse_args(argv[1:])
    assert "--rank" not in argv, "JOB_COMPLETION_INDEX gives the rank"
    # A batch MiniCluster completes: vnetd ends when the operator's wait.sh marks the end.
    assert argv[argv.index("--exit-on-file") + 1] == OPERATOR_MARKER
    assert OPERATOR_MARKER == "/mnt/flux/flux-operator-complete.txt"
    assert body["tasks"] == spec.size, "the command runs on every rank"
    assert vnetd["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
    security = vnetd["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert security["runAsUser"] == 0 and security["allowPrivilegeEscalation"] is False
    volumes = vnetd["volumes"]
    config = volumes[config_map["metadata"]["name"]]  # the operator names it after the map
    assert config["configMapName"] == config_map["metadata"]["name"]
    assert config["path"] + "/mesh.toml" == argv[argv.index("--config") + 1]
    assert volumes["dev-net"] == {"hostPath": "/dev/net", "path": "/dev/net"}


def test_options_and_ipv6_listen(tmp_path: Path):
    path = tmp_path / "lab6.toml"
    path.write_text(LAB6_TOML + '\n[http]\nlisten = "[::]:9191"\n')
    options = MiniClusterOptions(image=IMAGE, app_image="ghcr.io/x/app:1", command="./run")
    _, minicluster, _ = rendered(path, options)
    flux, vnetd = minicluster["spec"]["containers"]
    assert (flux["image"], flux["command"]) == ("ghcr.io/x/app:1", "./run")
    assert "/dev/tcp/::1/9191" in flux["commands"]["pre"]
    assert "--http-listen '[::]:9191'" in vnetd["command"]
    assert "enable_ipv6 = true" in minicluster["spec"]["flux"]["brokerConfig"]
    validate_crd(minicluster, f"minicluster-{DEFAULT_OPERATOR_VERSION}")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    target = tmp_path / "minicluster.yaml"
    code, out, err = run(
        capsys, "render", "minicluster", "--config", str(SIDECAR_SPEC), "--image", IMAGE,
        "--app-image", "ghcr.io/x/app:1", "--command", "flux run -N 4 hostname",
        "-o", str(target),
    )  # fmt: skip
    assert (code, out, err) == (0, "", "")
    options = MiniClusterOptions(IMAGE, "ghcr.io/x/app:1", "flux run -N 4 hostname")
    spec = load_spec(SIDECAR_SPEC)
    assert target.read_text() == render_minicluster(spec, SIDECAR_SPEC.read_text(), options)
    code, out, err = run(
        capsys, "render", "minicluster", "--config", str(SIDECAR_SPEC), "--image", IMAGE,
        "--operator-version", "0.2.1", "--tasks", "1", "--mesh-policy",
    )  # fmt: skip
    assert code == 0, err
    options = MiniClusterOptions(IMAGE, operator_version="0.2.1", tasks=1, mesh_policy=True)
    assert out == render_minicluster(spec, SIDECAR_SPEC.read_text(), options)
    code, out, err = run(capsys, "render", "minicluster", "--config", str(SIDECAR_SPEC))
    assert code == 0 and "kind: MiniCluster" in out
    assert "--image: registry.example.org/vnetd:0.1.0 is a placeholder" in err


@pytest.mark.parametrize(
    ("mesh", "argv", "message"),
    [
        pytest.param(
            'hostname = "n{rank}"', [], r"mesh\.hostname: 'n\{rank\}' cannot be", id="host"
        ),
        pytest.param(
            'hostname = "job-{rank}"',
            [],
            r"mesh\.name: 'm' is not the MiniCluster's name 'job' that mesh\.hostname "
            r"'job-\{rank\}' gives its pods; set mesh\.name = 'job' or mesh\.hostname = "
            r"'\{name\}-\{rank\}'",
            id="name",
        ),
        pytest.param("", ["--app-image", "a b"], r"--app-image: 'a b' is not an image", id="app"),
        pytest.param("", ["--tasks", "0"], r"--tasks: 0 is not a task count", id="tasks"),
        pytest.param(
            "", ["--queue-policy", "lifo"], r"--queue-policy: 'lifo' is not a Fluxion", id="queue"
        ),
        pytest.param(
            "", ["--deadline", "0"], r"--deadline: 0 is not a number of seconds", id="deadline"
        ),
        pytest.param(
            "",
            ["--operator-version", "main"],
            r"--operator-version: 'main' is not a version vnetd was checked against; install "
            r"one of 0d75cef8, 0\.2\.1",
            id="version",
        ),
        pytest.param(
            '[wireguard]\npreshared_key_file = "psk"',
            [],
            r"wireguard\.preshared_key_file: 'psk' is not an absolute file path: the pods "
            r"mount it from the Secret vnetd-preshared-key \(key 'psk'\)",
            id="psk-relative",
        ),  # fmt: skip
        pytest.param(
            '[registry]\npassword_file = "/mnt/flux/pw"\nusername = "u"',
            [],
            r"registry\.password_file: '/mnt/flux/pw' is under a directory vnetd mounts "
            r"already: the pods mount it from the Secret vnetd-etcd-password",
            id="password-taken",
        ),  # fmt: skip
    ],
)
def test_cli_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mesh: str, argv: list[str], message: str
):
    config = tmp_path / "mesh.toml"
    config.write_text(f'[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\n{mesh}\n')
    code, out, err = run(capsys, "render", "minicluster", "--config", str(config), *argv)
    assert (code, out) == (2, "")
    assert err.startswith("vnetd: error: ") and err.count("\n") == 1
    assert re.search(message, err), err


def operator_pod_labels(minicluster: dict[str, Any], namespace: str) -> dict[str, str]:
    """The labels the operator's Job gives each pod (controllers/flux ``getPodLabels`` and
    ``NewMiniClusterJob``, main and 0.2.1 alike): ``spec.pod.labels``, then its own, which
    overwrite ``app.kubernetes.io/name`` with the MiniCluster's name."""
    name = minicluster["metadata"]["name"]
    return {
        **minicluster["spec"]["pod"]["labels"],
        "namespace": namespace,
        "app": "flux-operator",
        "app.kubernetes.io/name": name,
        "hpa-selector": name,
    }


def admits(policy: dict[str, Any], pod: dict[str, str], port: str) -> bool:
    """Whether an ingress rule of ``policy`` admits a pod with labels ``pod`` on ``port``."""
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        for peer in rule.get("from", []):
            match = peer.get("podSelector", {}).get("matchLabels")
            if match is not None and match.items() <= pod.items() and port in ports:
                return True
    return False


def test_etcd_network_policy_admits_the_pods_as_the_operator_labels_them():
    policy = yaml.safe_load((ROOT / "manifests" / "etcd" / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy"
    for version in VERSIONS:
        pod = operator_pod_labels(minicluster_of(SIDECAR_SPEC, version), "flux-sample")
        assert admits(policy, pod, "client"), pod
        # Without spec.pod.labels the operator's own labels are all a pod has: refused.
        bare = {k: v for k, v in pod.items() if not k.startswith("app.kubernetes.io/") or
                k == "app.kubernetes.io/name"}  # fmt: skip
        assert not admits(policy, bare, "client"), bare
    # The Job that render manifests writes is admitted too.
    docs = yaml.safe_load_all((ROOT / "manifests" / "sidecar" / "vnetd.yaml").read_text())
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert admits(policy, job["spec"]["template"]["metadata"]["labels"], "client")


def test_the_budget_and_the_opt_in_mesh_policy_select_the_ranks(tmp_path: Path):
    spec = load_spec(SIDECAR_SPEC)
    options = MiniClusterOptions(image=IMAGE, mesh_policy=True)
    _, minicluster, budget, policy = rendered(SIDECAR_SPEC, options)
    pod = operator_pod_labels(minicluster, "flux-sample")
    assert budget["spec"]["minAvailable"] == spec.size, "a drain waits for the job"
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod.items()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod.items()
    assert admits(policy, pod, spec.port)
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 51820, "protocol": "UDP"}]
    # Prometheus, from its namespace, on the metrics port (no pod selector: any pod there).
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    assert policy["spec"]["ingress"][1] == {
        "from": [prometheus], "ports": [{"port": 9090, "protocol": "TCP"}]
    }  # fmt: skip
    options = MiniClusterOptions(image=IMAGE, mesh_policy=True, monitoring_namespace="obs")
    policy = rendered(SIDECAR_SPEC, options)[3]
    assert policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "obs"
    }
    assert len(rendered(SIDECAR_SPEC, MiniClusterOptions(image=IMAGE))) == 3, "opt-in"


def test_the_mesh_policy_admits_the_doorbell_when_pairs_are_lazy(tmp_path: Path):
    lazy = tmp_path / "mesh.toml"
    lazy.write_text(SIDECAR_SPEC.read_text().replace("[mesh]\n", "[mesh]\ntree_fanout = 256\n", 1))
    policy = rendered(lazy, MiniClusterOptions(image=IMAGE, mesh_policy=True))[3]
    assert policy["spec"]["ingress"][0]["ports"] == [
        {"port": 51820, "protocol": "UDP"},
        {"port": 51822, "protocol": "UDP"},
    ]


def test_a_tree_fanout_other_than_the_operators_is_refused_with_one_line(tmp_path: Path):
    """The gate waits for the operator's tree (tbon.fanout 256); lazy pairs of another tree
    would never handshake before the brokers start, so the gate would never open."""
    lazy = tmp_path / "mesh.toml"
    lazy.write_text(SIDECAR_SPEC.read_text().replace("[mesh]\n", "[mesh]\ntree_fanout = 2\n", 1))
    with pytest.raises(SpecError) as caught:
        rendered(lazy, MiniClusterOptions(image=IMAGE))
    assert str(caught.value).startswith("mesh.tree_fanout: 2 is not the tree the operator's")
    assert "\n" not in str(caught.value) and "mesh.tree_fanout = 256" in str(caught.value)


SECRETS_TOML = """
[wireguard]
preshared_key_file = "/etc/vnetd-psk/preshared.key"
"""
PASSWORD_TOML = """
[registry]
endpoints = ["http://etcd-client:2379"]
username = "vnetd"
password_file = "/etc/vnetd-password/password"
"""


def test_a_minicluster_copies_the_spec_secrets_0400(tmp_path: Path):
    """The operator mounts Secrets 0644, which vnetd refuses for a pre-shared key: each
    Secret is mounted aside and copied 0400 where the spec names it before vnetd starts."""
    path = tmp_path / "mesh.toml"
    base = SIDECAR_SPEC.read_text().split("[registry]")[0]
    path.write_text(base + SECRETS_TOML + PASSWORD_TOML)
    for version in VERSIONS:
        _, minicluster, _ = rendered(
            path, MiniClusterOptions(image=IMAGE, operator_version=version)
        )
        validate_crd(minicluster, f"minicluster-{version}")
        vnetd = minicluster["spec"]["containers"][1]
        volumes = vnetd["volumes"]
        assert volumes["vnetd-preshared-key"] == {
            "secretName": "vnetd-preshared-key", "path": "/run/vnetd-secrets/vnetd-preshared-key",
            "readOnly": True,
        }  # fmt: skip
        assert volumes["vnetd-etcd-password"]["secretName"] == "vnetd-etcd-password"
        command = vnetd["command"]
        assert ("install -D -m 0400 /run/vnetd-secrets/vnetd-preshared-key/preshared.key "
                "/etc/vnetd-psk/preshared.key && ") in command  # fmt: skip
        assert "/run/vnetd-secrets/vnetd-etcd-password/password /etc/vnetd-password/password" in (
            command
        )
        assert command.index("install") < command.index("exec vnetd up")


def test_render_manifests_mounts_the_spec_secrets(tmp_path: Path):
    from vnetd.render.manifests import ManifestOptions, render_manifests

    spec_text = SIDECAR_SPEC.read_text().replace("[http]", SECRETS_TOML.strip() + "\n\n[http]")
    docs = yaml.safe_load_all(
        render_manifests(
            load_spec_text(tmp_path, spec_text), spec_text, ManifestOptions(image=IMAGE)
        )
    )
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (vnetd,) = [c for c in pod["initContainers"] if c["name"] == "vnetd"]
    assert {"name": "vnetd-preshared-key", "mountPath": "/etc/vnetd-psk/preshared.key",
            "subPath": "preshared.key", "readOnly": True} in vnetd["volumeMounts"]  # fmt: skip
    (volume,) = [v for v in pod["volumes"] if v["name"] == "vnetd-preshared-key"]
    assert volume["secret"] == {
        "secretName": "vnetd-preshared-key", "defaultMode": 0o400,
        "items": [{"key": "preshared.key", "path": "preshared.key"}],
    }  # fmt: skip


def load_spec_text(tmp_path: Path, text: str) -> Any:  # noqa: ANN401 - a MeshSpec
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return load_spec(path)


@pytest.mark.parametrize("version", VERSIONS)
def test_service_mesh_sidecars_are_opted_out(version: str):
    """Istio's and Linkerd's injection is off in every pod (annotations the operator copies
    to its pod template, labels it keeps), and Istio's capture skips the overlay."""
    minicluster = minicluster_of(SIDECAR_SPEC, version)
    pod = minicluster["spec"]["pod"]
    assert pod["annotations"] == {
        "sidecar.istio.io/inject": "false",
        "traffic.sidecar.istio.io/excludeInterfaces": "vnet0",
        "linkerd.io/inject": "disabled",
    }
    labels = operator_pod_labels(minicluster, "flux-sample")
    assert labels["sidecar.istio.io/inject"] == "false"
    assert labels["istio.io/dataplane-mode"] == "none", "Istio's ambient mode"
    validate_crd(minicluster, f"minicluster-{version}")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_application_runs_the_distribution_of_the_versions_flux_view(version: str):
    """0.2.1's default view is Rocky 9, the commit's Ubuntu noble (test_operator_versions
    reads both from the CRDs); the view's Flux runs on the application's libraries."""
    flux, vnetd = minicluster_of(SIDECAR_SPEC, version)["spec"]["containers"]
    assert flux["image"] == OPERATOR_VERSIONS[version].app_image
    marker = shlex.split(vnetd["command"].split("exec ", 1)[1])
    assert marker[marker.index("--exit-on-file") + 1] == OPERATOR_VERSIONS[version].marker


@pytest.mark.parametrize("version", VERSIONS)
def test_kernel_wireguard_is_the_least_privilege_form(version: str):
    """``--kernel-wireguard``: no host path (wireguard-go's /dev/net/tun), the kernel data
    plane asked for by name so a node without the module fails instead of needing one."""
    options = MiniClusterOptions(image=IMAGE, operator_version=version, kernel_wireguard=True)
    _, minicluster, _ = rendered(SIDECAR_SPEC, options)
    validate_crd(minicluster, f"minicluster-{version}")
    vnetd = minicluster["spec"]["containers"][1]
    assert not any("hostPath" in v for v in vnetd["volumes"].values())
    argv = shlex.split(vnetd["command"].split("exec ", 1)[1])
    assert argv[argv.index("--dataplane") + 1] == "kernel"
    build_parser().parse_args(argv[1:])
    default = minicluster_of(SIDECAR_SPEC, version)["spec"]["containers"][1]
    assert default["volumes"]["dev-net"] == {"hostPath": "/dev/net", "path": "/dev/net"}
    assert "--dataplane" not in default["command"], "auto by default"
    assert vnetd["securityContext"] == default["securityContext"], "NET_ADMIN either way"


@pytest.mark.parametrize("version", VERSIONS)
def test_pre_waits_at_the_mesh_gate_bounded_by_the_gate_timeout(version: str):
    """After /readyz, ``pre`` polls /gatez with the version's tree and gives up after
    ``--gate-timeout`` (default 600 s, or half a shorter deadline), asking for the verdict."""
    pre = minicluster_of(SIDECAR_SPEC, version)["spec"]["containers"][0]["commands"]["pre"]
    assert pre.index("GET /readyz") < pre.index("GET /gatez?%s")
    assert '"fanout=256"' in pre and '"fanout=256&verdict=1"' in pre
    assert "vnetd_gate_end=$((SECONDS + 600))" in pre
    options = MiniClusterOptions(image=IMAGE, operator_version=version, gate_timeout=20)
    _, minicluster, _ = rendered(SIDECAR_SPEC, options)
    assert (
        "vnetd_gate_end=$((SECONDS + 20))"
        in minicluster["spec"]["containers"][0]["commands"]["pre"]
    )
    validate_crd(minicluster, f"minicluster-{version}")
    short = MiniClusterOptions(image=IMAGE, operator_version=version, deadline=600)
    _, minicluster, _ = rendered(SIDECAR_SPEC, short)
    assert (
        "vnetd_gate_end=$((SECONDS + 300))"
        in minicluster["spec"]["containers"][0]["commands"]["pre"]
    )


@pytest.mark.parametrize("gate", [0, 600, 601])
def test_a_gate_timeout_not_below_the_deadline_is_refused_with_one_line(
    capsys: pytest.CaptureFixture[str], gate: int
):
    code, out, err = run(capsys, "render", "minicluster", "--config", str(SIDECAR_SPEC),
                         "--deadline", "600", "--gate-timeout", str(gate))  # fmt: skip
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"vnetd: error: --gate-timeout: {gate} is not a number of seconds below --deadline 600; "
        "give 1 to 599 (how long each pod waits for the ranks its broker needs before the "
        "Job fails)"
    )
