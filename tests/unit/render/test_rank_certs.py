"""Each pod speaks for its own rank only (``render.rank_certs``): where the spec pins
``[mesh] rank_ca``, the Indexed Job's and the StatefulSet's vnetd container alone mounts
cert-manager's csi-driver volume, and the certificate the driver would issue a pod of
index i is taken by readers at rank i and at no other; the DaemonSet and the MiniCluster,
which cannot hold one, are refused. The shipped etcd has auth on:
``tests/unit/test_manifests.py::test_shipped_etcd_has_auth_turned_on``."""

from __future__ import annotations

import base64
import re
import textwrap
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_schemas import validate_custom
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import NameOID
from render_fixtures import BURST_TOML

from vnetd.control import rank_cert
from vnetd.control.proof import Signer
from vnetd.errors import SpecError
from vnetd.render import rank_certs
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.render.minicluster import MiniClusterOptions, render_minicluster
from vnetd.render.operator_versions import OPERATOR_VERSIONS
from vnetd.spec import MeshSpec, parse_spec

Obj = dict[str, Any]

CA = Signer.generate()
OTHER_CA = Signer.generate()
SIZE = 4
NAMESPACE = "hpc"
DOCS = Path(__file__).parents[3] / "docs"


def spec_toml(name: str = "rk", rank_ca: bool = True, size: int = SIZE) -> str:
    pinned = f'rank_ca = ["{CA.public_key}"]\n' if rank_ca else ""
    return (
        f'[mesh]\nname = "{name}"\nsize = {size}\nnetwork = "10.250.0.0/24"\n'
        f'hostname = "{{name}}-{{rank}}"\n{pinned}'
    )


def spec_of(text: str) -> MeshSpec:
    return parse_spec(tomllib.loads(text))


def rendered(text: str, options: ManifestOptions | None = None) -> list[Obj]:
    stream = render_manifests(spec_of(text), text, options or ManifestOptions())
    return list(yaml.safe_load_all(stream))


def pod_of(objects: list[Obj], kind: str) -> Obj:
    (workload,) = [o for o in objects if o["kind"] == kind]
    pod: Obj = workload["spec"]["template"]["spec"]
    return pod


def containers(pod: Obj) -> dict[str, Obj]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def rank_cert_volume(pod: Obj) -> Obj:
    (volume,) = [v for v in pod["volumes"] if "csi" in v]
    return volume


WORKLOADS = [
    pytest.param(ManifestOptions(), "Job", id="indexed-job"),
    pytest.param(ManifestOptions(ranks="2-3"), "StatefulSet", id="statefulset"),
]


@pytest.mark.parametrize(("options", "kind"), WORKLOADS)
def test_only_the_vnetd_container_mounts_the_pods_rank_certificate(
    options: ManifestOptions, kind: str
):
    objects = rendered(spec_toml(), options)
    pod = pod_of(objects, kind)
    volume = rank_cert_volume(pod)
    assert volume["name"] == rank_certs.VOLUME
    assert volume["csi"]["driver"] == "csi.cert-manager.io"
    assert volume["csi"]["readOnly"] is True  # csi-lib refuses a volume without it
    assert volume["csi"]["volumeAttributes"] == {
        "csi.cert-manager.io/issuer-name": "vnetd-rk-ranks",
        "csi.cert-manager.io/issuer-kind": "Issuer",
        "csi.cert-manager.io/key-algorithm": "Ed25519",
        "csi.cert-manager.io/key-usages": "digital signature",
        "csi.cert-manager.io/uri-sans": "vnetd://rk/${POD_NAMESPACE}/${POD_NAME}/${POD_UID}",
        "csi.cert-manager.io/duration": "24h",
        "csi.cert-manager.io/reuse-private-key": "true",
    }
    mounting = {
        name
        for name, c in containers(pod).items()
        if any(m["name"] == rank_certs.VOLUME for m in c.get("volumeMounts", []))
    }
    assert mounting == {"vnetd"}, "the workload containers must mount nothing of it"
    vnetd = containers(pod)["vnetd"]
    (mount,) = [m for m in vnetd["volumeMounts"] if m["name"] == rank_certs.VOLUME]
    assert mount == {"name": rank_certs.VOLUME, "mountPath": "/etc/vnetd-rank", "readOnly": True}
    args = vnetd["args"]
    assert args[args.index("--signing-key-file") + 1] == "/etc/vnetd-rank/tls.key"
    assert args[args.index("--rank-cert-file") + 1] == "/etc/vnetd-rank/tls.crt"
    (workload,) = [o for o in objects if o["kind"] == kind]
    for version in ("1.29", "1.33"):
        kubernetes_validate.validate(workload, version, strict=True)


@pytest.mark.parametrize(("options", "kind"), WORKLOADS)
def test_without_rank_ca_no_pod_mounts_a_rank_certificate(options: ManifestOptions, kind: str):
    pod = pod_of(rendered(spec_toml(rank_ca=False), options), kind)
    assert not [v for v in pod["volumes"] if "csi" in v]
    assert "--rank-cert-file" not in containers(pod)["vnetd"]["args"]


def issued(pod_name: str, attributes: dict[str, str], ca: Signer = CA) -> tuple[str, str]:
    """(signing key, base64 DER certificate) as cert-manager's csi-driver issues them for
    ``pod_name`` from the volume's attributes: an Ed25519 key made for the pod, the URI
    SAN templated from the pod (Go's ``os.Expand``), no subject, signed by the CA Issuer."""
    assert attributes["csi.cert-manager.io/key-algorithm"] == "Ed25519"
    pod = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": pod_name, "POD_UID": "0d3c-uid"}
    uri = re.sub(r"\$\{(\w+)\}", lambda m: pod[m.group(1)], attributes[
        "csi.cert-manager.io/uri-sans"])  # fmt: skip
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vnetd rk rank CA")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=24))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), True)
        .add_extension(x509.KeyUsage(True, *[False] * 8), critical=True)
        .sign(ca.private_key, None)
    )
    return base64.b64encode(public).decode(), base64.b64encode(
        cert.public_bytes(Encoding.DER)
    ).decode()


@pytest.mark.parametrize(
    ("options", "kind", "pod_name"),
    [
        pytest.param(ManifestOptions(), "Job", "rk-{i}-ab12c", id="indexed-job"),
        pytest.param(ManifestOptions(ranks="0-3"), "Job", "rk-{i}-x9z0q", id="site-job"),
        pytest.param(ManifestOptions(ranks="1-3"), "StatefulSet", "rk-{i}", id="statefulset"),
    ],
)
def test_a_pods_certificate_is_taken_at_its_own_rank_and_no_other(
    options: ManifestOptions, kind: str, pod_name: str
):
    """The wrong index gets nothing: pod i's certificate, issued from the rendered volume's
    attributes, vouches for its key at rank i only (``control.rank_cert``, as readers
    check every record)."""
    text = spec_toml()
    spec = spec_of(text)
    attributes = rank_cert_volume(pod_of(rendered(text, options), kind))["csi"]["volumeAttributes"]
    cache = rank_cert.CertCache()
    for i in range(SIZE):
        key, cert = issued(pod_name.format(i=i), attributes)
        taken = [
            k for k in range(SIZE) if rank_cert.refusal(spec, k, key, cert, cache=cache) is None
        ]
        assert taken == [i], f"pod {pod_name.format(i=i)}'s certificate is taken at {taken}"
    key, cert = issued("rk-1-ab12c", attributes, ca=OTHER_CA)
    assert rank_cert.refusal(spec, 1, key, cert, cache=cache) == (
        "field cert is not signed by a CA of mesh.rank_ca"
    )
    for impostor in ("rk-1-AB12C", "rk-1-ab12", "rk-10-ab12c", "rk-1x", "other-1-ab12c"):
        key, cert = issued(impostor, attributes)
        assert all(rank_cert.refusal(spec, k, key, cert, cache=cache) for k in range(SIZE)), (
            impostor
        )


def test_the_daemonset_holds_no_rank_certificate_and_refuses_rank_ca():
    with pytest.raises(SpecError, match=r"^mesh\.rank_ca: a DaemonSet chooses each pod's rank"):
        rendered(spec_toml(), ManifestOptions(mode="daemonset"))
    pod = pod_of(rendered(spec_toml(rank_ca=False), ManifestOptions(mode="daemonset")), "DaemonSet")
    assert not [v for v in pod["volumes"] if "csi" in v]


@pytest.mark.parametrize("version", sorted(OPERATOR_VERSIONS))
def test_the_minicluster_refuses_rank_ca_on_every_pinned_operator(version: str):
    """0.2.1 has no CSI volume for a container; 0d75cef8's sets no ``csi.readOnly``, which
    cert-manager's csi-driver refuses to mount (so the pod would never start)."""
    text = spec_toml(name="flux-sample")
    options = MiniClusterOptions(operator_version=version)
    with pytest.raises(SpecError, match=r"^mesh\.rank_ca: the Flux Operator") as refused:
        render_minicluster(spec_of(text), text, options)
    assert "\n" not in str(refused.value)
    assert rank_certs.CSI_DRIVER not in render_minicluster(
        spec_of(spec_toml(name="flux-sample", rank_ca=False)),
        spec_toml(name="flux-sample", rank_ca=False),
        options,
    )


def test_a_job_whose_pod_names_would_lose_the_index_is_refused():
    name = "m" * 55  # "<55>-9-" is 58 characters, "<55>-10-" (size 11) is 59
    render_manifests(spec_of(spec_toml(name=name, size=10)), spec_toml(name=name, size=10))
    text = spec_toml(name=name, size=11)
    with pytest.raises(SpecError, match=r"^mesh\.name: the Job's pods would be named"):
        render_manifests(spec_of(text), text)
    # A StatefulSet's pods are named <name>-<ordinal>: nothing is cut.
    render_manifests(spec_of(text), text, ManifestOptions(ranks="1-10"))


def test_the_documented_rank_ca_objects_are_the_issuer_the_pods_name():
    """docs/kubernetes.md's rank CA (self-signed Issuer, Ed25519 CA Certificate whose key
    is never rotated, CA Issuer) validates against cert-manager's schema, and its CA Issuer
    is the one the rendered volume names for the docs' mesh."""
    text = (DOCS / "kubernetes.md").read_text()
    section = text.split("## Rank certificates", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    objects = [o for block in blocks for o in yaml.safe_load_all(textwrap.dedent(block))]
    issuers = [
        o for o in objects if isinstance(o, dict) and o.get("kind") in {"Issuer", "Certificate"}
    ]
    assert [o["kind"] for o in issuers] == ["Issuer", "Certificate", "Issuer"]
    for obj in issuers:
        schema = (
            "issuer-cert-manager-v1" if obj["kind"] == "Issuer" else "certificate-cert-manager-v1"
        )
        validate_custom(obj, schema, "1.33")
    root, ca, issuer = issuers
    assert ca["spec"]["privateKey"] == {"algorithm": "Ed25519", "rotationPolicy": "Never"}
    assert (
        ca["spec"]["isCA"] is True and ca["spec"]["issuerRef"]["name"] == root["metadata"]["name"]
    )
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    example = spec_of(spec_toml(name="flux-sample"))
    assert issuer["metadata"]["name"] == rank_certs.issuer_name(example)
    volume = yaml.safe_load(blocks[0])[0]
    assert volume["csi"] == {
        "driver": rank_certs.CSI_DRIVER,
        "readOnly": True,
        "volumeAttributes": rank_certs.volume_attributes(example),
    }


def test_a_pinned_gateway_key_and_rank_certificates_are_refused_together():
    """The csi-driver makes each pod a new key, never the one ``gateway_keys`` pins."""
    pin = Signer.generate().public_key
    text = (
        BURST_TOML.replace(
            "site_keepalive = 25", f'site_keepalive = 25\nrank_ca = ["{CA.public_key}"]'
        )
        + f'gateway_keys = {{ 32 = "{pin}" }}\n'
    )
    spec = spec_of(text)
    with pytest.raises(SpecError, match=r"^sites\.b\.gateway_keys: rank 32's signing key"):
        render_manifests(spec, text, ManifestOptions(site="b", ranks="32-63"))
    with pytest.raises(SpecError, match=r"^sites\.b\.gateway_keys"):
        render_manifests(spec, text)
    objects = list(yaml.safe_load_all(render_manifests(spec, text, ManifestOptions(
        site="a", ranks="0-31"))))  # fmt: skip
    assert rank_cert_volume(pod_of(objects, "Job"))["name"] == rank_certs.VOLUME
