"""``vnetd render manifests``: golden files, what the objects say, the checks, the CLI.

Schema validation of the output and the kustomize bases live in
``tests/unit/test_manifests.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_fixtures import EXAMPLE, LAB6_TOML

from vnetd.cli import main
from vnetd.errors import SpecError
from vnetd.render.flux import render_flux
from vnetd.render.manifests import (
    DEFAULT_IMAGE,
    ManifestOptions,
    job_name,
    manifest_warnings,
    render_manifests,
)
from vnetd.spec import MeshSpec, parse_spec

LAB6_HTTP_TOML = (
    LAB6_TOML
    + '\n[registry]\nendpoints = ["http://etcd-client:2379"]\n\n[http]\nlisten = "[::]:9191"\n'
)
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"

CASES = [
    pytest.param(
        EXAMPLE.read_text(),
        ManifestOptions(),
        "manifests-example-sidecar.yaml",
        id="example-sidecar",
    ),
    pytest.param(
        EXAMPLE.read_text(),
        ManifestOptions(mode="daemonset"),
        "manifests-example-daemonset.yaml",
        id="example-daemonset",
    ),
    pytest.param(
        LAB6_HTTP_TOML,
        ManifestOptions(image=IMAGE),
        "manifests-lab6-sidecar-image.yaml",
        id="ipv6-http-image-sidecar",
    ),
    pytest.param(
        LAB6_HTTP_TOML,
        ManifestOptions(mode="daemonset", image=IMAGE),
        "manifests-lab6-daemonset-image.yaml",
        id="ipv6-http-image-daemonset",
    ),
]


def spec_of(text: str) -> MeshSpec:
    return parse_spec(tomllib.loads(text))


def objects(text: str, options: ManifestOptions) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(render_manifests(spec_of(text), text, options)))
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return by_kind


def pod_spec(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    workload = objs.get("Job") or objs["DaemonSet"]
    return workload["spec"]["template"]["spec"]


def vnetd_container(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    pod = pod_spec(objs)
    found = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "vnetd"]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(("text", "options", "name"), CASES)
def test_matches_golden(text: str, options: ManifestOptions, name: str, golden):
    golden(name, render_manifests(spec_of(text), text, options))


@pytest.mark.parametrize(("text", "options", "name"), CASES)
def test_config_map_holds_the_spec_as_given(text: str, options: ManifestOptions, name: str):
    objs = objects(text, options)
    data = objs["ConfigMap"]["data"]
    assert data["mesh.toml"] == text
    assert spec_of(data["mesh.toml"]) == spec_of(text)
    if options.mode == "sidecar":
        assert set(data) == {"mesh.toml", "bootstrap.toml"}
        assert data["bootstrap.toml"] == render_flux(spec_of(text))
    else:
        assert set(data) == {"mesh.toml"}


@pytest.mark.parametrize(("text", "options", "name"), CASES)
def test_vnetd_container_follows_the_spec(text: str, options: ManifestOptions, name: str):
    spec = spec_of(text)
    objs = objects(text, options)
    container = vnetd_container(objs)
    assert container["image"] == options.image
    args = container["args"]
    assert args[:3] == ["up", "--config", "/etc/vnetd/mesh.toml"]
    listen = args[args.index("--http-listen") + 1]
    http_port = int(listen.rpartition(":")[2])
    assert http_port == (int(spec.http.listen.rpartition(":")[2]) if spec.http.listen else 9090)
    ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in container["ports"]}
    assert ports == {"wireguard": (spec.port, "UDP"), "vnetd-http": (http_port, "TCP")}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "vnetd-http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "vnetd-http"}
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert security["runAsUser"] == 0 and security["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/dev/net/tun"] == "dev-net-tun"
    assert mounts["/run/wireguard"] == "wireguard-sock"
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    assert set(mounts.values()) <= set(volumes)
    assert volumes["dev-net-tun"]["hostPath"] == {"path": "/dev/net/tun", "type": "CharDevice"}
    config = volumes["vnetd-config"]["configMap"]
    assert config["name"] == objs["ConfigMap"]["metadata"]["name"] == f"{spec.name}-vnetd"
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert env["POD_IP"] == "status.podIP" and env["POD_NAME"] == "metadata.name"
    assert pod_spec(objs)["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(("text", "options", "name"), [c for c in CASES if "sidecar" in c.id])
def test_sidecar_job_is_indexed_and_named_after_the_host_names(
    text: str, options: ManifestOptions, name: str
):
    spec = spec_of(text)
    objs = objects(text, options)
    job = objs["Job"]
    job_spec = job["spec"]
    assert job_spec["completionMode"] == "Indexed"
    assert job_spec["completions"] == job_spec["parallelism"] == spec.size
    # An Indexed Job's pod r has host name "<job name>-r": the spec's host of rank r.
    name = job["metadata"]["name"]
    assert [f"{name}-{r}" for r in range(spec.size)] == [spec.host(r) for r in range(spec.size)]
    pod = job_spec["template"]["spec"]
    # OnFailure would count sidecar restarts of every pod against backoffLimit.
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == objs["Service"]["metadata"]["name"] == name
    assert job_spec["podReplacementPolicy"] == "Failed"
    # A drain or a preemption costs no retry; a rank that fails for good fails the Job.
    assert job_spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    assert (job_spec["backoffLimitPerIndex"], job_spec["maxFailedIndexes"]) == (3, 0)
    assert "backoffLimit" not in job_spec, "it would count every rank's failures together"
    budget = objs["PodDisruptionBudget"]["spec"]
    assert budget["minAvailable"] == spec.size
    assert budget["selector"]["matchLabels"] == job_spec["template"]["metadata"]["labels"]
    assert job_spec["activeDeadlineSeconds"] > 0 and job_spec["ttlSecondsAfterFinished"] > 0
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == job_spec["template"]["metadata"]["labels"]
    init = {c["name"]: c for c in pod["initContainers"]}
    assert list(init) == ["flux-curve-cert", "vnetd"], "the certificate copy runs first"
    sidecar = init["vnetd"]
    assert sidecar["restartPolicy"] == "Always"
    assert "--rank" not in sidecar["args"], "the rank comes from JOB_COMPLETION_INDEX"
    service = objs["Service"]["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"].items() <= job_spec["template"]["metadata"]["labels"].items()
    flux = pod["containers"][0]
    assert flux["command"][:2] == ["/bin/bash", "-c"]
    script = flux["command"][2]
    assert "/readyz" in script and "exit 1" in script, "the broker waits for vnetd, bounded"
    assert script.endswith(
        "exec flux broker --config-path=/etc/flux/config "
        f"-Stbon.interface-hint={spec.interface} flux run -N {spec.size} hostname\n"
    )
    assert flux["resources"]["requests"] and flux["resources"]["limits"]["memory"]
    assert "runAsUser" not in flux["securityContext"], "the image's own non-root user"
    volumes = {v["name"]: v for v in pod["volumes"]}
    flux_config = volumes["flux-config"]["configMap"]
    assert flux_config["items"] == [{"key": "bootstrap.toml", "path": "bootstrap.toml"}]
    # flux-core refuses a certificate its group or others can read: the init container
    # copies the Secret into a 0400 file of the broker's own user.
    copy = init["flux-curve-cert"]
    assert copy["image"] == flux["image"] and copy["securityContext"] == flux["securityContext"]
    source, target = copy["command"][-2:]
    assert target == "/etc/flux/system/curve.cert" and "chmod 0400" in copy["command"][2]
    mounts = {m["name"]: m["mountPath"] for m in copy["volumeMounts"]}
    assert source.startswith(mounts["flux-curve-secret"] + "/")
    assert target.startswith(mounts["flux-curve-cert"] + "/")
    assert {m["name"] for m in flux["volumeMounts"]} == {"flux-config", "flux-curve-cert"}
    assert volumes["flux-curve-cert"]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize(("text", "options", "name"), [c for c in CASES if "daemonset" in c.id])
def test_daemonset_runs_on_the_host_network_of_labelled_nodes(
    text: str, options: ManifestOptions, name: str
):
    spec = spec_of(text)
    objs = objects(text, options)
    ds = objs["DaemonSet"]["spec"]
    pod = ds["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["nodeSelector"] == {"vnetd/mesh": spec.name}
    assert pod["priorityClassName"] == "vnetd-node-critical"
    container = vnetd_container(objs)
    assert container["command"][:2] == ["/bin/sh", "-c"] and container["command"][3] == "vnetd"
    assert {"name": "VNETD_UNDERLAY_INTERFACE", "value": ""} in container["env"]
    assert ds["selector"]["matchLabels"].items() <= ds["template"]["metadata"]["labels"].items()
    args = vnetd_container(objs)["args"]
    assert args[args.index("--rank") + 1] == "auto"
    assert args[args.index("--instance") + 1] == "$(NODE_NAME)"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["vnetd-state"]["hostPath"]["path"] == f"/var/lib/vnetd/{spec.name}"


def test_spec_change_changes_the_pod_template_annotation():
    text = EXAMPLE.read_text()
    other = text.replace("size = 8 ", "size = 9 ")
    assert other != text

    def digest(t: str) -> str:
        job = objects(t, ManifestOptions())["Job"]
        return job["spec"]["template"]["metadata"]["annotations"]["vnetd/spec-sha256"]

    assert digest(text) != digest(other)
    assert digest(text) == digest(text)


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        pytest.param(
            'name = "m"\nhostname = "node{rank}"',
            r"mesh\.hostname: 'node\{rank\}' cannot be a pod host name in an Indexed Job",
            id="no-dash",
        ),
        pytest.param(
            'name = "m"\nhostname = "{rank}-node"',
            r"mesh\.hostname: '\{rank\}-node' cannot be",
            id="rank-first",
        ),
        pytest.param(
            'name = "m"\nhostname = "{name}-{rank}.cluster"',
            r"mesh\.hostname: .* cannot be",
            id="domain",
        ),
        pytest.param(
            'name = "1st"', r"mesh\.hostname: '\{name\}-\{rank\}' cannot be", id="digit-first"
        ),
        pytest.param(
            'name = "m"\nhostname = "Node-{rank}"', r"mesh\.hostname: .* cannot be", id="upper"
        ),
        pytest.param(
            f'name = "{"a" * 61}"',
            r"mesh\.hostname: 'a{61}-99' is longer than 63 characters",
            id="too-long",
        ),
    ],
)
def test_sidecar_refuses_host_names_an_indexed_job_cannot_have(mesh: str, message: str):
    text = f'[mesh]\n{mesh}\nsize = 100\nnetwork = "10.0.0.0/16"\n'
    spec = spec_of(text)
    with pytest.raises(SpecError, match=message):
        render_manifests(spec, text, ManifestOptions())
    with pytest.raises(SpecError, match=message):
        job_name(spec)
    # A DaemonSet does not name hosts: the same spec renders.
    assert "kind: DaemonSet" in render_manifests(spec, text, ManifestOptions(mode="daemonset"))


def test_job_name_of_a_literal_prefix():
    text = '[mesh]\nname = "m"\nsize = 100\nnetwork = "10.0.0.0/16"\nhostname = "job7-{rank}"\n'
    assert job_name(spec_of(text)) == "job7"
    assert job_name(spec_of(text.replace("size = 100", "size = 1"))) == "job7"


def test_http_port_zero_is_refused():
    text = '[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\n[http]\nlisten = "0.0.0.0:0"\n'
    with pytest.raises(SpecError, match=r"http\.listen: '0\.0\.0\.0:0' picks a free port"):
        render_manifests(spec_of(text), text, ManifestOptions())


def test_spec_text_must_match_the_spec():
    text = EXAMPLE.read_text()
    with pytest.raises(ValueError, match="does not parse to the spec"):
        render_manifests(spec_of(text.replace("size = 8 ", "size = 7 ")), text)


def test_warnings_name_a_loopback_registry():
    example = spec_of(EXAMPLE.read_text())
    assert manifest_warnings(example, IMAGE) == [
        "registry.endpoints: http://127.0.0.1:2379 is a loopback address, which in a pod is "
        "the pod itself; point it at etcd's client Service (https://etcd-client:2379 for "
        "manifests/etcd)"
    ]
    local = spec_of(
        '[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\n[registry]\n'
        'endpoints = ["http://localhost:2379", "https://[::1]:2379", "http://etcd-client:2379"]\n'
    )
    assert [w.split(" is ")[0] for w in manifest_warnings(local, IMAGE)] == [
        "registry.endpoints: http://localhost:2379",
        "registry.endpoints: https://[::1]:2379",
    ]
    assert manifest_warnings(spec_of(LAB6_HTTP_TOML), IMAGE) == []
    assert manifest_warnings(spec_of(LAB6_HTTP_TOML)) == [
        f"--image: {DEFAULT_IMAGE} is a placeholder: build the Dockerfile, push it to your "
        "registry and give its name (docs/kubernetes.md, step 1)"
    ]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_stdout_file_and_warning(capsys, tmp_path: Path):
    code, out, err = run(capsys, "render", "manifests", "--config", str(EXAMPLE))
    assert code == 0
    assert out == render_manifests(spec_of(EXAMPLE.read_text()), EXAMPLE.read_text())
    assert f"image: {DEFAULT_IMAGE}\n" in out
    assert err.startswith("vnetd: warning: registry.endpoints: http://127.0.0.1:2379 is a loopback")
    assert err.count("\n") == 2 and f"--image: {DEFAULT_IMAGE} is a placeholder" in err
    target = tmp_path / "vnetd.yaml"
    code, out2, _ = run(
        capsys,
        "render",
        "manifests",
        "--config",
        str(EXAMPLE),
        "--mode",
        "daemonset",
        "--image",
        IMAGE,
        "-o",
        str(target),
    )
    assert (code, out2) == (0, "")
    expected = render_manifests(
        spec_of(EXAMPLE.read_text()),
        EXAMPLE.read_text(),
        ManifestOptions(mode="daemonset", image=IMAGE),
    )
    assert target.read_text() == expected
    assert target.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--image", ""], r"--image: '' is not an image reference", id="empty-image"),
        pytest.param(
            ["--image", "vnetd 0.1"], r"--image: 'vnetd 0\.1' is not an image", id="space-image"
        ),
        pytest.param(["--image=-vnetd"], r"--image: '-vnetd' is not an image", id="dash-image"),
    ],
)
def test_cli_bad_image(capsys, tmp_path: Path, argv: list[str], message: str):
    config = tmp_path / "mesh.toml"
    config.write_text('[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\n')
    code, out, err = run(capsys, "render", "manifests", "--config", str(config), *argv)
    assert (code, out) == (2, "")
    assert err.startswith("vnetd: error: ") and err.count("\n") == 1
    assert re.search(message, err), err


def test_cli_bad_host_name_is_one_line(capsys, tmp_path: Path):
    config = tmp_path / "mesh.toml"
    config.write_text(
        '[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\nhostname = "n{rank}"\n'
    )
    code, out, err = run(capsys, "render", "manifests", "--config", str(config))
    assert (code, out) == (2, "")
    assert (
        err.startswith("vnetd: error: mesh.hostname: 'n{rank}' cannot be") and err.count("\n") == 1
    )


def test_cli_bad_mode_is_refused_by_argparse(capsys, tmp_path: Path):
    with pytest.raises(SystemExit) as info:
        main(["render", "manifests", "--config", str(EXAMPLE), "--mode", "deployment"])
    assert info.value.code == 2
    assert "invalid choice: 'deployment'" in capsys.readouterr().err


def test_renderer_imports_no_io_libraries():
    code = (
        "import sys\n"
        "import vnetd.render.manifests\n"
        "print(sorted(m for m in ('trio', 'httpx', 'pyroute2') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout == "[]\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            '[mesh]  \nname = "m"\t# tab, trailing spaces  \nsize = 2\nnetwork = "10.0.0.0/24"\n',
            id="trailing-spaces-and-tab",
        ),
        pytest.param('[mesh]\r\nname = "m"\r\nsize = 2\r\nnetwork = "10.0.0.0/24"\r\n', id="crlf"),
        pytest.param(
            '# ---\n# ...\n# : { } [ ] & * ! | > % @ ` é 🙂\n[mesh]\nname = "m"\nsize = 2\n'
            'network = "10.0.0.0/24"',
            id="yaml-markers-unicode-no-final-newline",
        ),
    ],
)
def test_awkward_spec_text_survives_yaml(text: str):
    spec = spec_of(text)
    for mode in ("sidecar", "daemonset"):
        rendered = render_manifests(spec, text, ManifestOptions(mode=mode))
        config_map = next(yaml.safe_load_all(rendered))
        assert config_map["data"]["mesh.toml"] == text
        assert spec_of(config_map["data"]["mesh.toml"]) == spec


TLS_TOML = (
    '[mesh]\nname = "m"\nsize = 2\nnetwork = "10.0.0.0/24"\n[registry]\n'
    'endpoints = ["https://etcd-client:2379"]\n{files}'
)
TLS_FILES = (
    'ca_file = "/etc/vnetd-etcd/ca.crt"\ncert_file = "/etc/vnetd-etcd/tls.crt"\n'
    'key_file = "/etc/vnetd-etcd/tls.key"\n'
)


@pytest.mark.parametrize("mode", ["sidecar", "daemonset"])
def test_etcd_client_certificate_is_mounted_where_the_spec_reads_it(mode: str):
    text = TLS_TOML.format(files=TLS_FILES)
    objs = objects(text, ManifestOptions(mode=mode, image=IMAGE))
    container = vnetd_container(objs)
    assert {"name": "etcd-client-tls", "mountPath": "/etc/vnetd-etcd", "readOnly": True} in (
        container["volumeMounts"]
    )
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    assert volumes["etcd-client-tls"]["secret"] == {
        "secretName": "vnetd-etcd-client-tls",
        "defaultMode": 0o400,
    }
    plain = objects(TLS_TOML.format(files=""), ManifestOptions(mode=mode, image=IMAGE))
    assert "etcd-client-tls" not in {v["name"] for v in pod_spec(plain)["volumes"]}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param(
            'cert_file = "/etc/certs/client.pem"\n',
            r"registry\.cert_file: '/etc/certs/client\.pem': the manifests mount the Secret "
            r"vnetd-etcd-client-tls, whose keys are ca\.crt, tls\.crt and tls\.key",
            id="name",
        ),
        pytest.param(
            'ca_file = "/etc/a/ca.crt"\ncert_file = "/etc/b/tls.crt"\n',
            r"registry\.ca_file: put ca_file, cert_file and key_file in one directory",
            id="two-dirs",
        ),
        pytest.param(
            'ca_file = "/etc/vnetd/ca.crt"\n',
            r"registry\.ca_file: put .* \(not under /etc/vnetd",
            id="config-dir",
        ),
    ],
)
def test_etcd_tls_files_the_secret_cannot_provide_are_refused(files: str, message: str):
    text = TLS_TOML.format(files=files)
    with pytest.raises(SpecError, match=message):
        render_manifests(spec_of(text), text, ManifestOptions(image=IMAGE))
