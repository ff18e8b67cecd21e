"""``vnetd render provision``: the Job that makes a mesh's etcd user and turns auth on
(docs/kubernetes.md, "etcd with auth on"). Schemas and compositions are checked in
tests/unit/test_manifests.py; here, what the spec must say and what the Job runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from vnetd.cli import build_parser, main
from vnetd.errors import SpecError
from vnetd.render.provision_job import render_provision
from vnetd.spec import load_spec, parse_spec

ROOT = Path(__file__).parents[3]
SIDECAR = ROOT / "manifests" / "sidecar" / "mesh.toml"


def spec_with(registry: str) -> object:
    text = f"""[mesh]
name = "m"
size = 4
network = "10.250.0.0/24"
[registry]
endpoints = ["https://etcd-client:2379"]
{registry}"""
    return parse_spec(tomllib.loads(text))


@pytest.mark.parametrize(
    ("registry", "needle"),
    [
        pytest.param("", "registry.username: the mesh's daemons need an etcd user", id="no-user"),
        pytest.param('username = "vnetd-m"\npassword_file = "/etc/pw/password"\n',
                     "registry.password_file: '/etc/pw/password': the provisioning Job finds "
                     "user 'vnetd-m''s password by the user's name; name the file "
                     "/etc/pw/vnetd-m", id="file-not-named-after-the-user"),
    ],
)  # fmt: skip
def test_the_spec_must_name_the_user_and_its_password_file(registry: str, needle: str) -> None:
    with pytest.raises(SpecError) as caught:
        render_provision(spec_with(registry))  # type: ignore[arg-type]
    assert needle in str(caught.value)


def test_the_job_provisions_the_specs_user_as_root_and_enables_auth() -> None:
    (job,) = yaml.safe_load_all(render_provision(load_spec(SIDECAR)))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.enable_auth and args.etcd_user == "root" and args.wait == 600
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = volumes[mounts[str(args.passwords)]]["secret"]
    assert secret["secretName"] == "vnetd-etcd-password"
    assert volumes[mounts["/etc/etcd-root"]]["secret"]["secretName"] == "etcd-root"
    assert volumes[mounts["/etc/vnetd"]]["configMap"]["name"] == "flux-sample-vnetd"
    assert all(m["readOnly"] for m in container["volumeMounts"]), "the Job writes nothing"
    assert pod["securityContext"]["runAsNonRoot"] and pod["restartPolicy"] == "Never"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vnetd", "etcd admits it"


def test_cli_writes_what_the_renderer_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "provision.yaml"
    image = "harbor.example.com/hpc/vnetd:0.1.0"
    argv = ["render", "provision", "--config", str(SIDECAR), "--image", image, "-o", str(target)]
    assert main(argv) == 0
    assert target.read_text() == render_provision(load_spec(SIDECAR), image)
    assert capsys.readouterr() == ("", "")
