"""``vnetd render minicluster``: the MiniCluster fits the Flux Operator's v1alpha2 API,
its broker config is ``vnetd render flux``'s, and vnetd runs beside Flux."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_schemas import validate_custom
from kubernetes_validate.utils import latest_version, major_minor
from render_fixtures import EXAMPLE, LAB6_TOML

from vnetd.cli import build_parser, main
from vnetd.render.minicluster import (
    OPERATOR_CURVE_CERT,
    MiniClusterOptions,
    broker_config,
    render_minicluster,
)
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[3]
SIDECAR_SPEC = ROOT / "manifests" / "sidecar" / "mesh.toml"
IMAGE = "harbor.hpc.internal/hpc/vnetd:0.1.0"
VERSIONS = sorted({"1.29", major_minor(latest_version())})
SCHEMA = "minicluster-v1alpha2"


def rendered(path: Path, options: MiniClusterOptions | None = None) -> list[dict[str, Any]]:
    text = render_minicluster(load_spec(path), path.read_text(), options)
    return list(yaml.safe_load_all(text))


def minicluster_of(path: Path) -> dict[str, Any]:
    config_map, minicluster = rendered(path, MiniClusterOptions(image=IMAGE))
    assert config_map["kind"] == "ConfigMap" and minicluster["kind"] == "MiniCluster"
    return minicluster


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", [SIDECAR_SPEC, EXAMPLE], ids=["sidecar-spec", "example"])
def test_minicluster_fits_the_v1alpha2_schema(path: Path, version: str):
    validate_custom(minicluster_of(path), SCHEMA, version)


def test_schema_catches_unknown_fields_and_wrong_types():
    minicluster = minicluster_of(SIDECAR_SPEC)
    minicluster["spec"]["flux"]["brokerconfig"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="'brokerconfig' was unexpected"):
        validate_custom(minicluster, SCHEMA, VERSIONS[0])
    minicluster = minicluster_of(SIDECAR_SPEC)
    minicluster["spec"]["size"] = "4"
    with pytest.raises(jsonschema.ValidationError, match="'4' is not of type 'integer'"):
        validate_custom(minicluster, SCHEMA, VERSIONS[0])
    minicluster = minicluster_of(SIDECAR_SPEC)
    minicluster["spec"]["containers"][1]["securityContext"]["capabilities"]["add"] = "NET_ADMIN"
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'array'"):
        validate_custom(minicluster, SCHEMA, VERSIONS[0])


def test_broker_config_is_what_render_flux_writes(capsys: pytest.CaptureFixture[str]):
    minicluster = minicluster_of(SIDECAR_SPEC)
    argv = ["render", "flux", "--config", str(SIDECAR_SPEC), "--curve-cert", OPERATOR_CURVE_CERT]
    assert main(argv) == 0
    flux_output = capsys.readouterr().out
    assert minicluster["spec"]["flux"]["brokerConfig"] == flux_output
    assert broker_config(load_spec(SIDECAR_SPEC)) == flux_output
    assert 'connect = "tcp://10.250.0.1:8050"' in flux_output, "fixed overlay addresses"


def test_pods_are_named_like_the_spec_hosts_and_vnetd_runs_beside_flux():
    spec = load_spec(SIDECAR_SPEC)
    config_map, minicluster = rendered(SIDECAR_SPEC, MiniClusterOptions(image=IMAGE))
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
    prefix = "unset PYTHONPATH; exec "
    assert vnetd["command"].startswith(prefix)
    argv = shlex.split(vnetd["command"].removeprefix(prefix))
    assert argv[0] == "vnetd"
    build_parser().parse_args(argv[1:])
    assert "--rank" not in argv, "JOB_COMPLETION_INDEX gives the rank"
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
    _, minicluster = rendered(path, options)
    flux, vnetd = minicluster["spec"]["containers"]
    assert (flux["image"], flux["command"]) == ("ghcr.io/x/app:1", "./run")
    assert "/dev/tcp/::1/9191" in flux["commands"]["pre"]
    assert "--http-listen '[::]:9191'" in vnetd["command"]
    assert "enable_ipv6 = true" in minicluster["spec"]["flux"]["brokerConfig"]
    validate_custom(minicluster, SCHEMA, VERSIONS[-1])


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
    code, out, err = run(capsys, "render", "minicluster", "--config", str(SIDECAR_SPEC))
    assert code == 0 and "kind: MiniCluster" in out
    assert "--image: registry.example.org/vnetd:0.1.0 is a placeholder" in err


@pytest.mark.parametrize(
    ("mesh", "argv", "message"),
    [
        pytest.param(
            'hostname = "n{rank}"', [], r"mesh\.hostname: 'n\{rank\}' cannot be", id="host"
        ),
        pytest.param("", ["--app-image", "a b"], r"--app-image: 'a b' is not an image", id="app"),
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
