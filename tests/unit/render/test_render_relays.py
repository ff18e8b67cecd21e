"""``vnetd render manifests --relays N``: the relays' Deployment and Service, the daemons
pointed at them, and what a relay pod holds (``render.relays``)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from vnetd.cli import build_parser
from vnetd.errors import SpecError
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.render.provision_job import render_provision
from vnetd.render.relays import RELAY_UID, SHIPPED_ISSUER, relay_url, relays_hint
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[3]
SIDECAR = ROOT / "manifests" / "sidecar" / "mesh.toml"
DAEMONSET = ROOT / "manifests" / "daemonset" / "mesh.toml"
EXAMPLE = ROOT / "examples" / "mesh.toml"
USER = "vnetd-flux-sample-relay"

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from test_manifests import validate  # noqa: E402  (the schema check of every rendered object)


def rendered(path: Path, **options: object) -> list[dict]:
    spec = load_spec(path)
    return list(yaml.safe_load_all(render_manifests(spec, path.read_text(),
                                                    ManifestOptions(**options))))  # fmt: skip


def one(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def vnetd_of(workload: dict) -> dict:
    pod = workload["spec"]["template"]["spec"]
    (container,) = [c for c in pod.get("initContainers", []) + pod["containers"]
                    if c["name"] == "vnetd"]  # fmt: skip
    return container


@pytest.mark.parametrize(("path", "mode", "workload"), [
    (SIDECAR, "sidecar", "Job"), (DAEMONSET, "daemonset", "DaemonSet")])  # fmt: skip
def test_the_daemons_read_through_the_relays_service_and_every_object_validates(
    path, mode, workload
):
    docs = rendered(path, mode=mode, relays=3, relay_user=USER)
    spec = load_spec(path)
    deployment = one(docs, "Deployment")
    services = [d for d in docs if d["kind"] == "Service"]
    (relay_service,) = [s for s in services if s["metadata"]["name"] == f"{spec.name}-relay"]
    assert deployment["spec"]["replicas"] == 3
    assert relay_service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert relay_service["spec"]["ports"][0]["port"] == 2381
    env = {e["name"]: e.get("value") for e in vnetd_of(one(docs, workload))["env"]}
    # The shipped specs reach etcd over TLS, so the relays serve HTTPS.
    assert env["VNETD_RELAYS"] == relay_url(spec) == f"https://{spec.name}-relay:2381"
    for doc in docs:
        validate(doc, f"render manifests --relays 3 ({mode})")


def test_a_relay_pod_holds_its_own_user_only_and_runs_unprivileged():
    docs = rendered(SIDECAR, relays=1, relay_user=USER)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:1] == ["relay"]
    parsed = build_parser().parse_args(args)  # vnetd's own parser takes the rendered line
    assert parsed.etcd_user == USER and parsed.etcd_password_file == f"/etc/vnetd-relay/{USER}"
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert secrets["relay-password"]["items"] == [{"key": USER, "path": USER}]
    assert secrets["relay-password"]["defaultMode"] == 0o440
    mesh_user = load_spec(SIDECAR).registry.username
    assert all(item["key"] != mesh_user for s in secrets.values() for item in s.get("items", []))
    assert "vnetd-preshared-key" not in {s["secretName"] for s in secrets.values()}
    assert (
        pod["securityContext"]["runAsUser"] == RELAY_UID and pod["securityContext"]["runAsNonRoot"]
    )
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Out of the Service while out of step with etcd; restarted only when it stops answering.
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "tcpSocket" in container["livenessProbe"]
    assert pod["automountServiceAccountToken"] is False


def test_relays_serve_https_with_a_certificate_the_daemons_ca_verifies():
    """Where the daemons verify etcd with a CA file, the relays serve HTTPS from the Secret
    <mesh>-relay-tls; with --relay-issuer, cert-manager's Certificate for the Service's
    name makes it (etcd-ca: the Issuer of etcd's own certificate, whose ca.crt is the
    daemons' CA file). Without TLS to etcd they serve plain HTTP."""
    spec = load_spec(SIDECAR)
    docs = rendered(SIDECAR, relays=2, relay_user=USER, relay_issuer=SHIPPED_ISSUER)
    certificate = one(docs, "Certificate")
    assert certificate["spec"]["dnsNames"] == [f"{spec.name}-relay"]
    assert certificate["spec"]["issuerRef"] == {"name": SHIPPED_ISSUER, "kind": "Issuer"}
    shipped = yaml.safe_load_all((ROOT / "manifests/components/etcd-cert-manager/"
                                  "certificates.yaml").read_text())  # fmt: skip
    (etcd_server,) = [d for d in shipped if d["metadata"]["name"] == "etcd-server"]
    assert etcd_server["spec"]["issuerRef"]["name"] == SHIPPED_ISSUER
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    parsed = build_parser().parse_args(container["args"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets["relay-tls"] == certificate["spec"]["secretName"] == f"{spec.name}-relay-tls"
    assert str(parsed.tls_cert) == f"{mounts['relay-tls']}/tls.crt"
    assert str(parsed.tls_key) == f"{mounts['relay-tls']}/tls.key"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for doc in docs:
        validate(doc, "render manifests --relays 2 --relay-issuer etcd-ca")
    # Without --relay-issuer: the same pods, the Secret made by hand (docs/kubernetes.md,
    # whose commands name the Service and the Secret these objects do).
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"subjectAltName=DNS:{spec.name}-relay " in guide
    assert f"create secret tls {secrets['relay-tls']} " in guide
    by_hand = rendered(SIDECAR, relays=2, relay_user=USER)
    assert "Certificate" not in {d["kind"] for d in by_hand}
    assert one(by_hand, "Deployment") == one(docs, "Deployment")
    plain = rendered(EXAMPLE, relays=2)  # etcd over plain HTTP: relays too
    assert "Certificate" not in {d["kind"] for d in plain}
    args = one(plain, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-cert" not in args and relay_url(load_spec(EXAMPLE)).startswith("http://")


def test_without_relays_nothing_changes():
    assert rendered(SIDECAR) == rendered(SIDECAR, relays=0)
    assert "Deployment" not in {d["kind"] for d in rendered(SIDECAR)}
    assert all(e["name"] != "VNETD_RELAYS" for e in vnetd_of(one(rendered(SIDECAR), "Job"))["env"])


@pytest.mark.parametrize(("path", "relays", "user", "message"), [
    pytest.param(SIDECAR, -1, USER, "--relays: -1 is not a count", id="negative"),
    pytest.param(SIDECAR, 0, USER, "--relay-user: it names the relays' etcd user", id="no-relays"),
    pytest.param(SIDECAR, 2, None, "give --relay-user NAME, a read-only user", id="mesh-user"),
    pytest.param(SIDECAR, 2, "a@b", "cannot be a key of the Secret", id="not-a-secret-key"),
    pytest.param(EXAMPLE, 2, USER, "the spec names no etcd user", id="auth-off"),
])  # fmt: skip
def test_relays_that_would_hold_too_much_or_nothing_are_refused(path, relays, user, message):
    with pytest.raises(SpecError, match=message):
        rendered(path, relays=relays, relay_user=user)


@pytest.mark.parametrize(("path", "relays", "message"), [
    pytest.param(SIDECAR, 0, "give --relays N too", id="no-relays"),
    pytest.param(EXAMPLE, 2, "this spec names no ca_file: drop it", id="no-tls"),
])  # fmt: skip
def test_an_issuer_for_relays_without_tls_is_refused(path, relays, message):
    user = USER if path == SIDECAR and relays else None
    with pytest.raises(SpecError, match=f"--relay-issuer: .*{message}"):
        rendered(path, relays=relays, relay_user=user, relay_issuer=SHIPPED_ISSUER)


def test_with_auth_off_the_relays_need_no_user():
    docs = rendered(EXAMPLE, relays=2)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert "--etcd-user" not in pod["containers"][0]["args"]
    for doc in docs:
        validate(doc, "render manifests --relays 2 (auth off)")


def test_the_provisioning_job_makes_the_relays_user():
    (job,) = yaml.safe_load_all(render_provision(load_spec(SIDECAR), relay_user=USER))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--relay-user", USER]
    assert build_parser().parse_args(args).relay_user == USER
    validate(job, "render provision --relay-user")


def test_a_large_mesh_without_relays_gets_a_hint():
    spec = load_spec(SIDECAR)
    assert relays_hint(spec, 0) == []
    big = replace(spec, size=1024)
    (hint,) = relays_hint(big, 0)
    assert "--relays 11" in hint and "1,048,576 watch events" in hint
    assert relays_hint(big, 4, SHIPPED_ISSUER) == []


def test_https_relays_whose_secret_nothing_renders_get_a_warning():
    spec = load_spec(SIDECAR)  # etcd over TLS
    (warning,) = relays_hint(spec, 2)
    assert f"the Secret {spec.name}-relay-tls, which these manifests do not make" in warning
    assert relays_hint(spec, 2, SHIPPED_ISSUER) == []
    assert relays_hint(load_spec(EXAMPLE), 2) == []  # plain HTTP relays need no Secret


@pytest.mark.parametrize("version", ["0.2.1", "0d75cef8"])
def test_a_minicluster_reads_through_its_relays(version):
    """``render minicluster --relays``: the relays beside the MiniCluster, vnetd's own
    ``--relay`` in the container's command (the operator takes no env from the downward
    API, a literal is fine here), and the CR still fits the operator's CRD."""
    from crd_schemas import validate_crd

    from vnetd.render.minicluster import MiniClusterOptions, render_minicluster

    spec = load_spec(SIDECAR)
    options = MiniClusterOptions(operator_version=version, relays=2, relay_user=USER)
    docs = list(yaml.safe_load_all(render_minicluster(spec, SIDECAR.read_text(), options)))
    minicluster = one(docs, "MiniCluster")
    (vnetd,) = [c for c in minicluster["spec"]["containers"] if c.get("name") == "vnetd"]
    argv = shlex.split(vnetd["command"].rpartition("exec ")[2])
    assert argv[argv.index("--relay") + 1] == relay_url(spec)
    assert build_parser().parse_args(argv[1:]).relay == [relay_url(spec)]
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    validate_crd(minicluster, f"minicluster-{version}")
    for doc in docs:
        if doc["kind"] != "MiniCluster":
            validate(doc, f"render minicluster --relays 2 ({version})")
    plain = list(yaml.safe_load_all(render_minicluster(spec, SIDECAR.read_text(),
                                                       MiniClusterOptions(operator_version=version))))  # fmt: skip
    assert "--relay" not in str(plain) and "Deployment" not in {d["kind"] for d in plain}


def test_a_sites_statefulset_reads_through_its_clusters_relays():
    import tomllib

    from render_fixtures import BURST_TOML

    from vnetd.spec import parse_spec

    spec = parse_spec(tomllib.loads(BURST_TOML))
    options = ManifestOptions(site="b", ranks="32-63", relays=1)
    docs = list(yaml.safe_load_all(render_manifests(spec, BURST_TOML, options)))
    env = {e["name"]: e.get("value") for e in vnetd_of(one(docs, "StatefulSet"))["env"]}
    assert env["VNETD_RELAYS"] == relay_url(spec)
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
