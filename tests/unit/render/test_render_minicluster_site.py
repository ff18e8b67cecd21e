"""``vnetd render minicluster --site NAME --ranks A-B``: a MiniCluster as one site of a burst.

The operator's Job index ``i`` is rank ``A + i``: vnetd's ``--rank`` and the
broker's ``FLUX_FAKE_HOSTNAME`` are shell expressions of ``JOB_COMPLETION_INDEX``,
expanded here by bash as the operator's scripts would; the gateway pieces are
``render manifests --site``'s; every render fits both versions' CRDs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schemas import validate_crd

from vnetd.cli import build_parser, main
from vnetd.errors import SpecError
from vnetd.render.minicluster import MiniClusterOptions, render_minicluster
from vnetd.render.operator_versions import OPERATOR_VERSIONS
from vnetd.spec import parse_spec

SPEC = """\
[mesh]
name = "burst"
size = 64
network = "10.250.0.0/24"

[registry]
endpoints = ["https://etcd-client:2379"]

[sites.a]
gateways = [30, 31]

[sites.b]
gateways = [32, 33]
"""
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"
ETCD = "https://etcd.a.example.org:2379"
VERSIONS = list(OPERATOR_VERSIONS)
Obj = dict[str, Any]


def render(text: str = SPEC, **options: Any) -> dict[str, list[Obj]]:  # noqa: ANN401
    rendered = render_minicluster(
        parse_spec(tomllib.loads(text)), text, MiniClusterOptions(image=IMAGE, **options)
    )
    found: dict[str, list[Obj]] = {}
    for doc in yaml.safe_load_all(rendered):
        found.setdefault(doc["kind"], []).append(doc)
    return found


def expanded(line: str, index: int) -> list[str]:
    """The words bash makes of ``line`` in a pod whose Job index is ``index``."""
    script = f'JOB_COMPLETION_INDEX={index}; for word in {line}; do echo "$word"; done'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def vnetd_argv(minicluster: Obj, index: int) -> list[str]:
    vnetd = minicluster["spec"]["containers"][1]
    return expanded(vnetd["command"].rpartition("exec ")[2], index)


@pytest.mark.parametrize("version", VERSIONS)
def test_site_b_runs_its_ranks_from_job_index_zero(version: str):
    docs = render(site="b", ranks="32-63", etcd=(ETCD,), operator_version=version)
    (minicluster,) = docs["MiniCluster"]
    validate_crd(minicluster, f"minicluster-{version}")
    body = minicluster["spec"]
    assert (body["size"], body["maxSize"]) == (32, 32), "a resize past 63 is site a's ranks"
    # R is encoded for every host of the mesh, so site b's brokers hold resources too.
    assert body["flux"]["bursting"] == {"hostlist": "burst-[0-63]"}
    hosts = tomllib.loads(body["flux"]["brokerConfig"])["bootstrap"]["hosts"]
    assert [h["host"] for h in hosts] == [f"burst-{r}" for r in range(64)]
    flux, vnetd, forwarding = body["containers"]
    # Job index 1 is rank 33: the broker finds it in [bootstrap] hosts by this name.
    first_line = flux["commands"]["pre"].splitlines()[0]
    assert expanded(first_line, 1) == ["export", "FLUX_FAKE_HOSTNAME=burst-33"]
    argv = vnetd_argv(minicluster, 1)
    args = build_parser().parse_args(argv[1:])
    assert (args.rank, args.site, args.etcd) == ("33", "b", [ETCD])
    assert str(args.public_endpoint_file) == "/etc/vnetd-public/33"
    public = vnetd["volumes"]["burst-vnetd-public"]
    assert public["items"] == {str(r): str(r) for r in range(32, 64)}
    assert public["path"] == "/etc/vnetd-public"
    # Forwarding only in the gateways' pods, which are Job indexes 0 and 1 here.
    assert forwarding["name"] == "vnetd-forwarding"
    assert forwarding["command"].endswith("forwarding 4 burst-0 burst-1")
    assert forwarding["securityContext"]["privileged"] is True
    services = {s["metadata"]["name"]: s for s in docs["Service"]}
    assert list(services) == ["burst-gateway-32", "burst-gateway-33"]
    selector = services["burst-gateway-33"]["spec"]["selector"]
    assert selector["batch.kubernetes.io/job-completion-index"] == "1"
    assert selector["app.kubernetes.io/component"] == "minicluster"
    assert services["burst-gateway-33"]["spec"]["ports"][0]["protocol"] == "UDP"
    (endpoints,) = [c for c in docs["ConfigMap"] if c["metadata"]["name"] == "burst-vnetd-public"]
    assert endpoints["data"] == {str(r): "" for r in range(32, 64)}


def test_site_a_is_the_lead_site_and_keeps_its_job_index_as_rank():
    docs = render(site="a", ranks="0-31")
    (minicluster,) = docs["MiniCluster"]
    flux, _, forwarding = minicluster["spec"]["containers"]
    assert "FLUX_FAKE_HOSTNAME" not in flux["commands"]["pre"]
    args = build_parser().parse_args(vnetd_argv(minicluster, 30)[1:])
    assert args.rank is None, "JOB_COMPLETION_INDEX is the rank"
    assert (args.site, str(args.public_endpoint_file)) == ("a", "/etc/vnetd-public/30")
    assert forwarding["command"].endswith("forwarding 4 burst-30 burst-31")
    assert [s["metadata"]["name"] for s in docs["Service"]] == [
        "burst-gateway-30",
        "burst-gateway-31",
    ]
    assert minicluster["spec"]["flux"]["bursting"] == {"hostlist": "burst-[0-63]"}


def test_without_site_or_ranks_the_minicluster_is_the_whole_mesh():
    docs = render()
    (minicluster,) = docs["MiniCluster"]
    assert "bursting" not in minicluster["spec"]["flux"]
    assert len(minicluster["spec"]["containers"]) == 2 and "Service" not in docs
    assert "--site" not in minicluster["spec"]["containers"][1]["command"]


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        pytest.param(
            SPEC,
            {"site": "b", "ranks": "30-63"},
            r"--ranks: ranks 30, 31 are gateways of site a",
            id="foreign-gateway",
        ),
        pytest.param(
            SPEC, {"site": "b", "ranks": "32,40"}, r"--ranks: '32,40' is not one range", id="gaps"
        ),
        pytest.param(
            SPEC.replace(
                "gateways = [32, 33]",
                'gateways = [32, 33]\ngateway_keys = { 33 = "' + "A" * 43 + '=" }',
            ),
            {"site": "b", "ranks": "32-63"},
            r"\[sites\.b\] gateway_keys: a MiniCluster has no init container to put gateway "
            r"33's pinned signing key in its state dir; render site b with `vnetd render "
            r"manifests --site b`",
            id="pinned",
        ),  # fmt: skip
        pytest.param(
            SPEC, {"site": "b", "ranks": "32-63", "size": 33}, r"--size: 33 .* 1 to 32", id="size"
        ),
    ],
)
def test_a_part_the_minicluster_cannot_run_is_refused(text: str, options: Obj, message: str):
    with pytest.raises(SpecError, match=message):
        render(text, **options)


def test_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    config = tmp_path / "mesh.toml"
    config.write_text(SPEC)
    argv = ["render", "minicluster", "--config", str(config), "--image", IMAGE, "--site", "b",
            "--ranks", "32-63", "--etcd", ETCD]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    options = MiniClusterOptions(image=IMAGE, site="b", ranks="32-63", etcd=(ETCD,))
    assert out == render_minicluster(parse_spec(tomllib.loads(SPEC)), SPEC, options)
    assert main([*argv[:-4], "--ranks", "30-63"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert re.search(r"--ranks: ranks 30, 31 are gateways of site a", err), err
    assert main([*argv[:6], "--site", "c", "--ranks", "0-1"]) == 0
    assert "--site: the spec names sites a, b and not c" in capsys.readouterr().err


BURSTING = Path(__file__).parents[3] / "docs" / "bursting.md"


def test_bursting_doc_renders_a_minicluster_per_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    """docs/bursting.md's spec and its ``render minicluster`` commands, run as written."""
    doc = BURSTING.read_text()
    spec_text = re.search(r"### The spec \(`mesh.toml`.*?```toml\n(.*?)```", doc, re.S)
    assert spec_text is not None
    (tmp_path / "mesh.toml").write_text(spec_text.group(1))
    commands = [
        shlex.split(line.split(" #", 1)[0])
        for block in re.findall(r"```sh\n(.*?)```", doc, flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("vnetd render minicluster")
    ]
    assert len(commands) == 2
    for argv, first, gateways in zip(commands, (0, 32), ((30, 31), (32, 33)), strict=True):
        output = tmp_path / argv[argv.index("-o") + 1]
        argv[argv.index("-o") + 1] = str(output)
        argv[argv.index("--config") + 1] = str(tmp_path / "mesh.toml")
        assert main(argv[1:]) == 0, capsys.readouterr().err
        docs: dict[str, list[Obj]] = {}
        for doc_ in yaml.safe_load_all(output.read_text()):
            docs.setdefault(doc_["kind"], []).append(doc_)
        (minicluster,) = docs["MiniCluster"]
        assert minicluster["metadata"]["name"] == "flux"
        assert (minicluster["spec"]["size"], minicluster["spec"]["maxSize"]) == (32, 32)
        names = [s["metadata"]["name"] for s in docs["Service"]]
        assert names == [f"flux-gateway-{g}" for g in gateways]
        argv_ = vnetd_argv(minicluster, 1)
        assert build_parser().parse_args(argv_[1:]).rank == (str(first + 1) if first else None)
