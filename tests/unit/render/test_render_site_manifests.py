"""``vnetd render manifests --site --ranks``: one site's part of a two-site mesh.

Golden files, what the objects say (pods named after their ranks, one
LoadBalancer per gateway selecting that pod, forwarding and public endpoints
for gateways only), the checks of the flags, and the CLI. Schema validation
is in ``tests/unit/test_manifests.py``; the forwarding script runs in
``tests/e2e/test_gateway_forwarding.py``.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_fixtures import BURST_TOML, EXAMPLE

from vnetd.cli import main
from vnetd.errors import SpecError
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.render.site_manifests import site_part, site_warnings
from vnetd.spec import MeshSpec, parse_spec

BURSTING = Path(__file__).parents[3] / "docs" / "bursting.md"
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"
SITE_A = ManifestOptions(image=IMAGE, site="a", ranks="0-31")
ETCD_A = "https://etcd.a.example.org:2379"
SITE_B = ManifestOptions(image=IMAGE, site="b", ranks="32-63", etcd=(ETCD_A,))


def spec_of(text: str) -> MeshSpec:
    return parse_spec(tomllib.loads(text))


def documents(options: ManifestOptions, text: str = BURST_TOML) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(render_manifests(spec_of(text), text, options)))


def named(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def init_containers(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["initContainers"]}


@pytest.mark.parametrize(
    ("options", "name"),
    [
        pytest.param(SITE_A, "manifests-burst-site-a.yaml", id="site-a"),
        pytest.param(SITE_B, "manifests-burst-site-b.yaml", id="site-b"),
    ],
)
def test_matches_golden(options: ManifestOptions, name: str, golden):
    golden(name, render_manifests(spec_of(BURST_TOML), BURST_TOML, options))


@pytest.mark.parametrize("text", [EXAMPLE.read_text(), BURST_TOML])
def test_without_the_new_flags_the_whole_mesh_is_rendered(text: str):
    whole = render_manifests(spec_of(text), text, ManifestOptions())
    assert render_manifests(spec_of(text), text, ManifestOptions(ranks=" ALL ")) == whole
    assert "--site" not in whole and "StatefulSet" not in whole and "LoadBalancer" not in whole


def test_site_a_is_an_indexed_job_of_its_ranks_with_a_gateway_at_index_0():
    docs = documents(SITE_A)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "flux-vnetd"),
        ("ConfigMap", "flux-vnetd-public"),
        ("Service", "flux"),
        ("Job", "flux"),
        ("Service", "flux-gateway-0"),
    ]
    by_name = named(docs)
    job = by_name[("Job", "flux")]["spec"]
    assert job["completions"] == job["parallelism"] == 32
    gateway = by_name[("Service", "flux-gateway-0")]["spec"]
    assert gateway["type"] == "LoadBalancer"
    assert gateway["ports"] == [
        {"name": "wireguard", "port": 51820, "targetPort": 51820, "protocol": "UDP"}
    ]
    pod_labels = job["template"]["metadata"]["labels"]
    assert gateway["selector"] == {**pod_labels, "batch.kubernetes.io/job-completion-index": "0"}
    init = init_containers(by_name[("Job", "flux")])
    assert list(init) == ["vnetd-forwarding", "flux-curve-cert", "vnetd"]
    assert init["vnetd-forwarding"]["command"][3:] == ["forwarding", "4", "flux-0"]
    args = init["vnetd"]["args"]
    assert args[args.index("--site") + 1] == "a"
    assert args[args.index("--public-endpoint-file") + 1] == "/etc/vnetd-public/$(VNETD_POD_INDEX)"
    env = {e["name"]: e for e in init["vnetd"]["env"]}
    assert env["VNETD_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    public = by_name[("ConfigMap", "flux-vnetd-public")]["data"]
    assert public == {str(rank): "" for rank in range(32)}


def test_site_b_is_a_stateful_set_whose_pods_are_named_after_ranks_32_to_63():
    spec = spec_of(BURST_TOML)
    docs = documents(SITE_B)
    by_name = named(docs)
    assert list(by_name) == [
        ("ConfigMap", "flux-vnetd"),
        ("ConfigMap", "flux-vnetd-public"),
        ("Service", "flux"),
        ("StatefulSet", "flux"),
        ("Service", "flux-gateway-32"),
        ("Service", "flux-gateway-33"),
    ]
    sts = by_name[("StatefulSet", "flux")]["spec"]
    assert sts["ordinals"] == {"start": 32} and sts["replicas"] == 32
    assert sts["serviceName"] == "flux" and sts["podManagementPolicy"] == "Parallel"
    # A StatefulSet's pod n is named, and has host name, "<name>-n": the spec's host of rank n.
    pods = [f"flux-{n}" for n in range(32, 64)]
    assert pods == [spec.host(rank) for rank in range(32, 64)]
    assert [spec.rank_of_host(pod) for pod in pods] == list(range(32, 64))
    pod = sts["template"]["spec"]
    assert pod["restartPolicy"] == "Always" and "subdomain" not in pod
    assert sts["selector"]["matchLabels"] == sts["template"]["metadata"]["labels"]
    for rank in (32, 33):
        selector = by_name[("Service", f"flux-gateway-{rank}")]["spec"]["selector"]
        assert selector["statefulset.kubernetes.io/pod-name"] == f"flux-{rank}"
    init = init_containers(by_name[("StatefulSet", "flux")])
    assert init["vnetd"]["args"][1:9] == [
        "--config",
        "/etc/vnetd/mesh.toml",
        "--etcd",
        ETCD_A,
        "--site",
        "b",
        "--public-endpoint-file",
        "/etc/vnetd-public/$(VNETD_POD_INDEX)",
    ]
    assert init["vnetd-forwarding"]["command"][3:] == ["forwarding", "4", "flux-32", "flux-33"]
    assert init["vnetd-forwarding"]["securityContext"]["privileged"] is True
    assert "privileged" not in init["vnetd"]["securityContext"]
    env = {e["name"]: e for e in init["vnetd"]["env"]}
    assert env["VNETD_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert set(by_name[("ConfigMap", "flux-vnetd-public")]["data"]) == {
        str(r) for r in range(32, 64)
    }


def test_a_site_without_gateways_among_its_ranks_gets_only_site_and_pod_count():
    docs = documents(ManifestOptions(site="b", ranks="40-63"))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "StatefulSet"]
    sts = docs[2]
    assert sts["spec"]["ordinals"] == {"start": 40} and sts["spec"]["replicas"] == 24
    args = init_containers(sts)["vnetd"]["args"]
    assert args[3:5] == ["--site", "b"] and "--public-endpoint-file" not in args
    assert "vnetd-forwarding" not in init_containers(sts)


def test_ranks_alone_keep_the_spec_site():
    text = EXAMPLE.read_text()
    docs = documents(ManifestOptions(ranks="0-3"), text)
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["completions"] == 4
    assert "--site" not in init_containers(job)["vnetd"]["args"]


def test_etcd_urls_replace_the_spec_endpoints_in_both_modes():
    for mode in ("sidecar", "daemonset"):
        docs = documents(ManifestOptions(mode=mode, etcd=(ETCD_A, "https://etcd-2:2379")))
        (workload,) = [d for d in docs if d["kind"] in ("Job", "DaemonSet")]
        pod = workload["spec"]["template"]["spec"]
        (vnetd,) = [
            c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "vnetd"
        ]
        assert vnetd["args"][3:7] == ["--etcd", ETCD_A, "--etcd", "https://etcd-2:2379"]
    with pytest.raises(SpecError, match=r"--etcd: 'etcd-a:2379' is not an etcd URL"):
        documents(ManifestOptions(etcd=("etcd-a:2379",)))


def test_an_ipv6_overlay_forwards_ipv6_too():
    text = BURST_TOML.replace('network = "10.250.0.0/24"', 'network = "fd00:250::/64"')
    docs = documents(SITE_B, text)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert init_containers(sts)["vnetd-forwarding"]["command"][4] == "6"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param(
            ManifestOptions(site="b", ranks="32-64"),
            r"--ranks: rank 64 in '32-64' is out of range; the ranks of this mesh are 0\.\.63",
            id="range-outside-the-spec",
        ),
        pytest.param(
            ManifestOptions(site="b", ranks="32-40,50"),
            r"--ranks: '32-40,50' is not one range; .* give A-B \(for example 32-50\)",
            id="not-one-range",
        ),
        pytest.param(
            ManifestOptions(site="a", ranks="0-33"),
            r"--ranks: ranks 32, 33 are gateways of site b \(\[sites\.b\] gateways\), "
            r"not of site a; render them with --site b",
            id="other-sites-gateways",
        ),
        pytest.param(
            ManifestOptions(ranks="0-31"),
            r"--ranks: rank 0 is a gateway of site a .* not of site default; "
            r"render them with --site a",
            id="site-missing",
        ),
        pytest.param(
            ManifestOptions(site="B", ranks="32-63"),
            r"--site: 'B' is not a site name",
            id="bad-site-name",
        ),
        pytest.param(
            ManifestOptions(mode="daemonset", site="b"),
            r"--site: the daemonset mode claims a rank per labelled node .* use --mode sidecar",
            id="daemonset-site",
        ),
        pytest.param(
            ManifestOptions(mode="daemonset", ranks="0-3"),
            r"--ranks: the daemonset mode",
            id="daemonset-ranks",
        ),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(options: ManifestOptions, message: str):
    spec = spec_of(BURST_TOML)
    with pytest.raises(SpecError, match=message) as info:
        render_manifests(spec, BURST_TOML, options)
    assert "\n" not in str(info.value)


def test_a_gateway_service_name_too_long_names_the_mesh_name():
    name = "f" * 58  # hosts "<name>-63" fit 63 characters; "<name>-gateway-32" does not
    text = BURST_TOML.replace('name = "flux"', f'name = "{name}"')
    with pytest.raises(SpecError, match=r"mesh\.name: the gateway Service .* use a shorter"):
        render_manifests(spec_of(text), text, SITE_B)


def test_a_site_the_spec_does_not_name_is_a_warning():
    spec = spec_of(BURST_TOML)
    part = site_part(spec, "sidecar", "c", "40-63")
    assert part is not None and part.gateways == ()
    (warning,) = site_warnings(spec, part)
    assert warning.startswith("--site: the spec names sites a, b and not c; c has no gateways")
    assert site_warnings(spec, site_part(spec, "sidecar", "b", "32-63")) == []
    assert site_warnings(spec, None) == []


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_renders_a_site_and_refuses_bad_flags(capsys, tmp_path: Path):
    config = tmp_path / "mesh.toml"
    config.write_text(BURST_TOML)
    argv = ["render", "manifests", "--config", str(config), "--image", IMAGE]
    code, out, err = run(capsys, *argv, "--site", "b", "--ranks", "32-63", "--etcd", ETCD_A)
    assert (code, err) == (0, "")
    assert out == render_manifests(spec_of(BURST_TOML), BURST_TOML, SITE_B)
    code, out, err = run(capsys, *argv, "--site", "c", "--ranks", "40-63")
    assert code == 0 and "kind: StatefulSet" in out
    assert err.startswith("vnetd: warning: --site: the spec names sites a, b and not c")
    code, out, err = run(capsys, *argv, "--etcd", "http://127.0.0.1:2379")
    assert code == 0 and "- http://127.0.0.1:2379\n" in out
    assert err.startswith("vnetd: warning: --etcd: http://127.0.0.1:2379 is a loopback address")
    code, out, err = run(capsys, *argv, "--site", "b", "--ranks", "0-63")
    assert (code, out) == (2, "")
    assert err == (
        "vnetd: error: --ranks: rank 0 is a gateway of site a ([sites.a] gateways), not of "
        "site b; render them with --site a, or give --ranks without them\n"
    )


def test_bursting_doc_renders_both_clusters_from_its_spec(capsys, tmp_path: Path):
    """docs/bursting.md's spec and its ``render manifests`` commands, run as written."""
    doc = BURSTING.read_text()
    spec_text = re.search(r"### The spec \(`mesh.toml`.*?```toml\n(.*?)```", doc, re.S)
    assert spec_text is not None
    (tmp_path / "mesh.toml").write_text(spec_text.group(1))
    commands = [
        shlex.split(line.split(" #", 1)[0])
        for block in re.findall(r"```sh\n(.*?)```", doc, flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("vnetd render manifests")
    ]
    assert len(commands) == 2
    for argv in commands:
        output = argv[argv.index("-o") + 1]
        argv[argv.index("-o") + 1] = str(tmp_path / output)
        argv[argv.index("--config") + 1] = str(tmp_path / "mesh.toml")
        code, _, err = run(capsys, *argv[1:])
        assert code == 0, err
        kinds = [d["kind"] for d in yaml.safe_load_all((tmp_path / output).read_text())]
        assert kinds.count("Service") == 3, "the headless Service and two gateways"


PINNED_KEY = "Ucb74ZcCxteNhokZkr//PfqCutO0VXNAQ6t5imezO7w="


@pytest.mark.parametrize("options", [SITE_A, SITE_B, ManifestOptions()], ids=["a", "b", "all"])
def test_a_pinned_gateway_key_reaches_every_pod_with_the_spec(options: ManifestOptions):
    """``gateway_keys`` is part of the mesh: every rendered ConfigMap carries it, so
    every pod's daemon refuses a forged gateway 32."""
    text = BURST_TOML + f'gateway_keys = {{ 32 = "{PINNED_KEY}" }}\n'
    configs = [
        doc["data"]["mesh.toml"]
        for doc in documents(options, text)
        if doc["kind"] == "ConfigMap" and "mesh.toml" in doc.get("data", {})
    ]
    assert configs
    assert all(spec_of(config).pinned_key(32) == PINNED_KEY for config in configs)


def test_a_pinned_gateway_gets_its_key_from_a_secret_only_its_copying_container_mounts():
    """Site b pins gateway 32 (not 33): one unprivileged init container, before vnetd,
    mounts the Secret's ``gateway-32.key`` and copies the pod's own key, if any, into
    the state dir; the vnetd container and site a's pods never mount the Secret."""
    text = BURST_TOML + f'gateway_keys = {{ 32 = "{PINNED_KEY}" }}\n'
    workload = named(documents(SITE_B, text))[("StatefulSet", "flux")]
    pod = workload["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    assert names == ["vnetd-forwarding", "flux-curve-cert", "vnetd-signing-key", "vnetd"]
    copy = init_containers(workload)["vnetd-signing-key"]
    assert copy["command"][3:] == ["signing-key", "/etc/vnetd-gateway-keys",
                                   "$(VNETD_POD_INDEX)", "/var/lib/vnetd"]  # fmt: skip
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in copy["env"]} == {
        "VNETD_POD_INDEX": "metadata.labels['apps.kubernetes.io/pod-index']"
    }
    security = copy["securityContext"]
    assert "privileged" not in security and security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert [(m["name"], m["mountPath"]) for m in copy["volumeMounts"]] == [
        ("vnetd-gateway-keys", "/etc/vnetd-gateway-keys"), ("vnetd-state", "/var/lib/vnetd")
    ]  # fmt: skip
    (secret,) = [v["secret"] for v in pod["volumes"] if v["name"] == "vnetd-gateway-keys"]
    assert secret == {"secretName": "vnetd-gateway-signing-keys", "defaultMode": 0o400,
                      "items": [{"key": "gateway-32.key", "path": "gateway-32.key"}]}  # fmt: skip
    others = [c for c in pod["initContainers"] + pod["containers"] if c is not copy]
    mounts = [m["name"] for c in others for m in c.get("volumeMounts", [])]
    assert mounts and "vnetd-gateway-keys" not in mounts
    assert "--signing-key-file" not in init_containers(workload)["vnetd"]["args"]
    # Site a pins nothing: its part is as before.
    job = named(documents(SITE_A, text))[("Job", "flux")]["spec"]["template"]["spec"]
    before = named(documents(SITE_A))[("Job", "flux")]["spec"]["template"]["spec"]
    assert [c["name"] for c in job["initContainers"]] == [
        c["name"] for c in before["initContainers"]
    ]  # fmt: skip
    assert [v["name"] for v in job["volumes"]] == [v["name"] for v in before["volumes"]]
    assert "vnetd-gateway-signing-keys" not in render_manifests(spec_of(text), text, SITE_A)
