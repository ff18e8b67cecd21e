"""``manifests/``, ``vnetd render manifests`` and ``docs/kubernetes.md``, checked offline.

* Every object in every file under ``manifests/``, and every document that
  ``vnetd render manifests`` writes, validates against the Kubernetes JSON
  schemas that kubernetes-validate ships (strict: unknown fields are errors);
  custom resources (cert-manager's, the Prometheus Operator's) against the
  schemas in ``tests/unit/render/schemas`` (``crd_schemas``).
* Every ``kustomization.yaml`` is well formed and every object file is in one.
  Each kustomization is composed here (resources, recursively, and the
  namespace, components) and compared with ``kubectl kustomize`` when kubectl
  exists, whose output (what ``kubectl apply -k`` sends) is validated document
  by document for 1.29 and the newest schemas (skipped, saying why, without
  kubectl); the
  composition is then checked for what the schemas cannot see: selectors
  that select, volumes and ports that exist, references that resolve, the
  vnetd command line, the etcd member list.
* The sidecar and DaemonSet bases are exactly what ``vnetd render manifests``
  and ``vnetd render provision`` write for the ``mesh.toml`` beside them.
* etcd as shipped is locked down: every composition with etcd holds a Job that runs
  ``vnetd provision --enable-auth`` against it as root, every mesh's spec names the
  user its Job makes; the peer port trusts a CA of its own that issued only the peer
  certificate, whose CN is ``--peer-cert-allowed-cn``; history is compacted within a
  bound the registry's resumes fit in, and the quota is alerted on.
* Every shell command in ``docs/kubernetes.md`` and ``manifests/README.md``
  exists: vnetd's parse with vnetd's own parser, kubectl's with kubectl
  (``--help`` rejects unknown subcommands and flags without a cluster); the
  walk-through names its steps in order.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from vnetd.cli import build_parser
from vnetd.commands.provision import plan_of
from vnetd.control.watcher import WATCH_RESTARTS
from vnetd.pacing import spaced
from vnetd.registry.etcd.pages import RESUME_WITHIN
from vnetd.render.manifests import ManifestOptions, Mode, render_manifests
from vnetd.render.monitoring import render_monitoring
from vnetd.render.provision_job import render_provision
from vnetd.spec import load_spec, parse_spec

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(Path(__file__).parent / "render"))
from crd_schemas import validate_custom  # noqa: E402  (a helper beside the render tests)
from render_fixtures import BURST_TOML  # noqa: E402

MANIFESTS = ROOT / "manifests"
DOC = ROOT / "docs" / "kubernetes.md"
EXAMPLE = ROOT / "examples" / "mesh.toml"

# 1.29: the oldest release these manifests support (native sidecars, podReplacementPolicy and
# backoffLimitPerIndex are beta and on by default from it), every release to 1.33, and the
# newest schema kubernetes-validate ships.
VERSIONS = sorted(
    {"1.29", "1.30", "1.31", "1.32", "1.33", ".".join(latest_version().split(".")[:2])},
    key=lambda v: tuple(map(int, v.split("."))),
)
KUSTOMIZATION = "kustomization.yaml"
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "components"}
COMPONENT = ("kustomize.config.k8s.io/v1alpha1", "Component")
# Custom resources: (apiVersion, kind) -> the schema in tests/unit/render/schemas.
CUSTOM = {
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1",
}
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}
WORKLOADS = {"Job", "StatefulSet", "DaemonSet"}
# Secrets the user creates before applying, or cert-manager makes (docs/kubernetes.md says how).
USER_SECRETS = {
    "flux-sample-curve-cert",
    "etcd-server-tls",
    "etcd-peer-tls",
    "vnetd-etcd-client-tls",
    "etcd-root",
    "vnetd-etcd-password",
}
BASES: dict[str, Mode] = {"sidecar": "sidecar", "daemonset": "daemonset"}
FIELD_PATHS = {"metadata.name", "metadata.namespace", "status.podIP", "spec.nodeName"}

Obj = dict[str, Any]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def all_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*") if p.is_file())


def object_files() -> list[Path]:
    return [p for p in all_files() if p.suffix == ".yaml" and p.name != KUSTOMIZATION]


def kustomization_dirs(components: bool = True) -> list[Path]:
    """Every directory with a kustomization.yaml; without ``components``, only those a
    ``kubectl kustomize`` builds on their own (a Component is built through an overlay)."""
    found = sorted(p.parent for p in MANIFESTS.rglob(KUSTOMIZATION))
    return [d for d in found if components or not is_component(d)]


def is_component(directory: Path) -> bool:
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    return (spec["apiVersion"], spec["kind"]) == COMPONENT


def load_documents(path: Path) -> list[Obj]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text())]
    assert docs and all(isinstance(doc, dict) for doc in docs), f"{rel(path)}: empty document"
    return docs


def validate(doc: Obj, where: str) -> None:
    """Validate one object against every version in VERSIONS; any failure fails the test."""
    kind = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    custom = CUSTOM.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    for version in VERSIONS:
        if custom is not None:
            try:
                validate_custom(doc, custom, version)
            except jsonschema.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{where}: {kind} is invalid ({custom}): {path}: {exc.message}")
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(
                f"{where}: {kind} is invalid in Kubernetes {version}: {path}: {exc.message}"
            )
        except Exception as exc:  # SchemaNotFoundError and friends: no schema is no pass
            pytest.fail(f"{where}: {kind} cannot be validated for {version}: {exc!r}")


def compose(directory: Path) -> list[Obj]:
    """What ``kubectl kustomize`` builds from the kustomizations used here."""
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    objects: list[Obj] = []
    for entry in [*spec.get("resources", []), *spec.get("components", [])]:
        target = directory / entry
        objects.extend(compose(target) if target.is_dir() else load_documents(target))
    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    return objects


def key(obj: Obj) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


@pytest.mark.parametrize("path", all_files(), ids=rel)
def test_every_file_is_of_a_checked_kind(path: Path):
    """A file this module does not check would go unnoticed: only these kinds may exist."""
    assert path.suffix in {".yaml", ".toml"} or path == MANIFESTS / "README.md", rel(path)
    if path.suffix == ".toml":
        assert path.name == "mesh.toml" and path.parent.name in BASES, rel(path)
        load_spec(path)


@pytest.mark.parametrize("path", object_files(), ids=rel)
def test_objects_validate_against_the_kubernetes_schemas(path: Path):
    for doc in load_documents(path):
        validate(doc, rel(path))


def rendered_cases() -> Iterator[Any]:
    for mode in BASES.values():
        yield pytest.param(EXAMPLE, mode, id=f"example-{mode}")
    for base, mode in BASES.items():
        yield pytest.param(MANIFESTS / base / "mesh.toml", mode, id=f"{base}-base-spec")


@pytest.mark.parametrize(("config", "mode"), list(rendered_cases()))
def test_rendered_manifests_validate(config: Path, mode: Mode):
    text = render_manifests(load_spec(config), config.read_text(), ManifestOptions(mode=mode))
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == (
        ["ConfigMap", "Service", "Job", "PodDisruptionBudget"]
        if mode == "sidecar"
        else ["ConfigMap", "DaemonSet"]
    )
    for doc in docs:
        validate(doc, f"render manifests --config {rel(config)} --mode {mode}")
    if config != EXAMPLE:  # the example names no etcd user: it runs with auth off
        (job,) = yaml.safe_load_all(render_provision(load_spec(config)))
        validate(job, f"render provision --config {rel(config)}")


PIN = 'gateway_keys = { 32 = "Ucb74ZcCxteNhokZkr//PfqCutO0VXNAQ6t5imezO7w=" }\n'


@pytest.mark.parametrize(
    ("site", "ranks", "workload", "pins"),
    [
        ("a", "0-31", "Job", ""),
        ("b", "32-63", "StatefulSet", ""),
        ("b", "40-63", "StatefulSet", ""),
        pytest.param("b", "32-63", "StatefulSet", PIN, id="b-32-63-pinned"),
    ],
)
def test_rendered_site_parts_validate(site: str, ranks: str, workload: str, pins: str):
    """``--site``/``--ranks`` add a StatefulSet, LoadBalancer Services and a ConfigMap;
    a pinned gateway, a Secret volume and the init container that copies its key."""
    text = BURST_TOML + pins
    options = ManifestOptions(site=site, ranks=ranks)
    docs = list(
        yaml.safe_load_all(render_manifests(parse_spec(tomllib.loads(text)), text, options))
    )
    assert workload in [d["kind"] for d in docs]
    for doc in docs:
        validate(doc, f"render manifests --site {site} --ranks {ranks}")


def test_schema_validation_catches_errors():
    """The validator really checks: a typo and a wrong type are both caught."""
    job = load_documents(MANIFESTS / "sidecar" / "vnetd.yaml")[2]
    job["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)
    stateful = load_documents(MANIFESTS / "etcd" / "statefulset.yaml")[0]
    stateful["spec"]["replicas"] = "3"
    with pytest.raises(kubernetes_validate.ValidationError, match="'3' is not of type"):
        kubernetes_validate.validate(stateful, VERSIONS[0], strict=True)


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=rel)
def test_kustomization_is_well_formed(directory: Path):
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    assert set(spec) <= KUSTOMIZATION_KEYS, f"unchecked keys: {set(spec) - KUSTOMIZATION_KEYS}"
    assert (spec["apiVersion"], spec["kind"]) in {
        ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
        COMPONENT,
    }
    resources = spec["resources"]
    assert resources and all(isinstance(r, str) for r in resources)
    assert len(set(resources)) == len(resources)
    for entry in resources:
        target = (directory / entry).resolve()
        assert target.is_relative_to(MANIFESTS), f"{entry} leaves manifests/"
        assert target.is_file() or (target / KUSTOMIZATION).is_file(), f"{entry} is missing"
    for entry in spec.get("components", []):
        assert is_component((directory / entry).resolve()), f"{entry} is not a Component"
    if is_component(directory):
        assert "namespace" not in spec and "components" not in spec
    if "namespace" in spec:
        assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", spec["namespace"])


def test_every_object_file_belongs_to_a_kustomization():
    used = set()
    for directory in kustomization_dirs():
        for entry in yaml.safe_load((directory / KUSTOMIZATION).read_text())["resources"]:
            target = (directory / entry).resolve()
            if target.is_file():
                used.add(target)
    assert sorted(rel(p) for p in object_files() if p.resolve() not in used) == []


def kubectl_kustomize(directory: Path) -> list[Obj]:
    """``kubectl kustomize DIRECTORY``'s documents; skips, saying why, without kubectl."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("kubectl is not installed: kustomizations were composed by this module only")
        pytest.skip("kubectl is not installed; test_composition_is_consistent still runs")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=rel)
def test_composition_matches_kubectl_kustomize(directory: Path):
    built = sorted(kubectl_kustomize(directory), key=key)
    ours = sorted(compose(directory), key=key)
    assert [key(o) for o in built] == [key(o) for o in ours]
    assert built == ours


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=rel)
def test_kubectl_kustomize_output_validates(directory: Path):
    """What ``kubectl apply -k`` would send: every document valid for 1.29 and the newest."""
    built = kubectl_kustomize(directory)
    assert built
    for doc in built:
        validate(doc, f"kubectl kustomize {rel(directory)}")


@pytest.mark.parametrize("directory", kustomization_dirs(components=False), ids=rel)
def test_composition_is_consistent(directory: Path):
    objects = compose(directory)
    keys = [key(o) for o in objects]
    assert len(keys) == len(set(keys)), "an object is defined twice"
    by_kind: dict[str, list[Obj]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    pods = [(w, w["spec"]["template"]) for k in WORKLOADS for w in by_kind.get(k, [])]
    assert pods, "no workload"
    for workload, template in pods:
        where = f"{rel(directory)}: {workload['kind']}/{workload['metadata']['name']}"
        selector = workload["spec"].get("selector", {}).get("matchLabels")
        if workload["kind"] != "Job":  # a Job's selector is generated
            assert selector and selector.items() <= template["metadata"]["labels"].items(), where
        claims = [c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])]
        check_pod(template["spec"], by_kind, where, claims)
    for service in by_kind.get("Service", []):
        check_service(service, pods, by_kind)
    for budget in by_kind.get("PodDisruptionBudget", []):
        wanted = budget["spec"]["selector"]["matchLabels"].items()
        assert any(wanted <= t["metadata"]["labels"].items() for _, t in pods), budget


def check_pod(pod: Obj, by_kind: dict[str, list[Obj]], where: str, claims: list[str]) -> None:
    config_maps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    assert not volumes.keys() & set(claims), where
    volumes.update((claim, {"name": claim, "persistentVolumeClaim": {}}) for claim in claims)
    containers = pod.get("initContainers", []) + pod["containers"]
    names = [c["name"] for c in containers]
    assert len(names) == len(set(names)), where
    mounted = set()
    for container in containers:
        at = f"{where} container {container['name']}"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{at}: mounts missing volume {mount['name']}"
            mounted.add(mount["name"])
        ports = {p["name"]: p for p in container.get("ports", [])}
        for port in ports.values():
            assert len(port["name"]) <= 15 and port.get("protocol", "TCP") in {"TCP", "UDP"}, at
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind, {}).get("httpGet")
            if probe and isinstance(probe["port"], str):
                assert probe["port"] in ports, f"{at}: {kind} names unknown port {probe['port']}"
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("fieldRef")
            assert ref is None or ref["fieldPath"] in FIELD_PATHS, f"{at}: {env}"
        if "restartPolicy" in container:
            assert container in pod.get("initContainers", []) and container["restartPolicy"] == (
                "Always"
            ), f"{at}: restartPolicy is for native sidecars only"
            assert container["startupProbe"]["httpGet"]["path"] == "/readyz", at
        if container["name"] == "vnetd":
            check_vnetd(container, volumes, config_maps, by_kind, pod, at)
        if container["name"] == "provision":
            check_provision(container, volumes, config_maps, at)
    assert set(volumes) == mounted, f"{where}: unused volumes {set(volumes) - mounted}"
    for volume in volumes.values():
        if "configMap" in volume:
            source = config_maps.get(volume["configMap"]["name"])
            assert source, f"{where}: ConfigMap {volume['configMap']['name']} is not defined"
            for item in volume["configMap"].get("items", []):
                assert item["key"] in source["data"], f"{where}: no key {item['key']}"
        if "secret" in volume:
            assert volume["secret"]["secretName"] in USER_SECRETS, where
            assert volume["secret"]["secretName"] in DOC.read_text(), "say how to create it"


def check_vnetd(
    container: Obj,
    volumes: dict[str, Obj],
    config_maps: dict[str, Obj],
    by_kind: dict[str, list[Obj]],
    pod: Obj,
    at: str,
) -> None:
    """The command line parses, its spec is the ConfigMap's, and the spec fits the workload."""
    args = container["args"]
    try:
        build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{at}: vnetd {shlex.join(args)} does not parse")
    config = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent))
    source = config_maps[volumes[mount["name"]]["configMap"]["name"]]
    spec = parse_spec(tomllib.loads(source["data"][config.name]))
    jobs = [j for j in by_kind.get("Job", []) if j["spec"]["template"]["spec"] is pod]
    for job in jobs:
        assert job["spec"]["completions"] == spec.size, at
        assert pod["subdomain"] in {s["metadata"]["name"] for s in by_kind.get("Service", [])}
    services = {s["metadata"]["name"] for s in by_kind.get("Service", [])}
    if "StatefulSet" in by_kind:  # composed with etcd: the spec must name its client Service
        hosts = {re.sub(r"^https?://([^:/]+).*$", r"\1", url) for url in spec.registry.endpoints}
        assert hosts <= services, f"{at}: registry.endpoints {hosts} are not Services here"


def check_provision(
    container: Obj, volumes: dict[str, Obj], config_maps: dict[str, Obj], at: str
) -> None:
    """A provisioning Job's ``vnetd provision`` parses, turns auth on as root with root's
    password from its Secret, and its spec (if any) is a ConfigMap's naming the user."""
    args = build_parser().parse_args(container["args"])
    assert args.command == "provision" and args.enable_auth and args.wait > 0, at
    assert args.etcd_user == "root", at
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    root = Path(args.etcd_password_file)
    assert mounts[str(root.parent)]["secret"]["secretName"] == "etcd-root", at
    if args.config is None:
        assert args.etcd == ["https://etcd-client:2379"], at
        return
    source = config_maps[mounts[str(args.config.parent)]["configMap"]["name"]]
    spec = parse_spec(tomllib.loads(source["data"][args.config.name]))
    assert spec.registry.password_file == f"{args.passwords}/{spec.registry.username}", at
    assert mounts[str(args.passwords)]["secret"]["secretName"] == "vnetd-etcd-password", at


def check_service(service: Obj, pods: list[tuple[Obj, Obj]], by_kind: dict[str, list[Obj]]) -> None:
    selector = service["spec"]["selector"].items()
    selected = [t for _, t in pods if selector <= t["metadata"]["labels"].items()]
    assert selected, f"Service {service['metadata']['name']} selects no pod"
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        for template in selected:
            container_ports = [
                p
                for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]
                for p in c.get("ports", [])
            ]
            assert any(
                p["name"] == target or p["containerPort"] == target for p in container_ports
            ), f"Service {service['metadata']['name']}: no container port {target}"


@pytest.mark.parametrize("base", sorted(BASES))
def test_bases_are_rendered_from_their_spec(base: str):
    """The spec is the single source of truth: the committed YAML is its rendering."""
    config = MANIFESTS / base / "mesh.toml"
    expected = render_manifests(
        load_spec(config), config.read_text(), ManifestOptions(mode=BASES[base])
    )
    assert (MANIFESTS / base / "provision.yaml").read_text() == render_provision(
        load_spec(config)
    ), (
        f"run: vnetd render provision --config manifests/{base}/mesh.toml -o manifests/{base}/provision.yaml"
    )
    assert (MANIFESTS / base / "vnetd.yaml").read_text() == expected, (
        f"run: vnetd render manifests --config manifests/{base}/mesh.toml --mode {BASES[base]} "
        f"-o manifests/{base}/vnetd.yaml"
    )
    monitoring = MANIFESTS / base / "monitoring" / "monitoring.yaml"
    assert monitoring.read_text() == render_monitoring(load_spec(config)), (
        f"run: vnetd render monitoring --config manifests/{base}/mesh.toml -o {rel(monitoring)}"
    )


def test_etcd_members_peers_budget_and_probes():
    objects = {key(o)[::2]: o for o in compose(MANIFESTS / "etcd")}
    stateful = objects[("StatefulSet", "etcd")]
    headless = objects[("Service", stateful["spec"]["serviceName"])]
    replicas = stateful["spec"]["replicas"]
    assert replicas == 3 and stateful["spec"]["podManagementPolicy"] == "Parallel"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert objects[("Service", "etcd-client")]["spec"].get("type", "ClusterIP") == "ClusterIP"
    budget = objects[("PodDisruptionBudget", "etcd")]
    assert budget["spec"]["minAvailable"] == replicas // 2 + 1
    pod = stateful["spec"]["template"]["spec"]
    affinity = pod["affinity"]["podAntiAffinity"]
    terms = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    (container,) = pod["containers"]
    flags = dict(arg.removeprefix("--").partition("=")[::2] for arg in container["args"])
    name, service = stateful["metadata"]["name"], headless["metadata"]["name"]
    assert flags["initial-cluster"] == ",".join(
        f"{name}-{i}=https://{name}-{i}.{service}:2380" for i in range(replicas)
    )
    assert flags["initial-advertise-peer-urls"] == f"https://$(POD_NAME).{service}:2380"
    assert flags["listen-client-urls"].startswith("https://")
    assert flags["name"] == "$(POD_NAME)"
    # TLS for clients and peers, each requiring a certificate of the CA.
    assert flags["client-cert-auth"] == flags["peer-client-cert-auth"] == ""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for prefix, secret in (("", "etcd-server-tls"), ("peer-", "etcd-peer-tls")):
        files = [flags[f"{prefix}{key}"] for key in ("trusted-ca-file", "cert-file", "key-file")]
        assert [Path(f).name for f in files] == ["ca.crt", "tls.crt", "tls.key"]
        assert {secrets[mounts[str(Path(f).parent)]] for f in files} == {secret}
    # The kubelet has no client certificate: probes use the plain metrics listener.
    assert flags["listen-metrics-urls"] == "http://0.0.0.0:2381"
    probes = {
        k: container[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/livez", "port": "metrics"},
        "livenessProbe": {"path": "/livez", "port": "metrics"},
        "readinessProbe": {"path": "/readyz", "port": "metrics"},
    }
    assert {"name": "metrics", "containerPort": 2381, "protocol": "TCP"} in container["ports"]
    version = re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.(\d+)", container["image"])
    assert version and int(version.group(1)) >= 11, "/livez and /readyz need etcd 3.5.11+"
    (claim,) = stateful["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/etcd"} in container[
        "volumeMounts"
    ]


def etcd_flags(directory: Path) -> dict[str, str]:
    objects = {key(o)[::2]: o for o in compose(directory)}
    (container,) = objects[("StatefulSet", "etcd")]["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").partition("=")[::2] for arg in container["args"])


def etcd_compositions() -> list[Path]:
    """Every kustomization a ``kubectl kustomize`` builds that holds etcd."""
    return [
        d
        for d in kustomization_dirs(components=False)
        if any(key(o)[::2] == ("StatefulSet", "etcd") for o in compose(d))
    ]


def provision_argvs(objects: list[Obj]) -> list[argparse.Namespace]:
    """The parsed command lines of every Job container that runs ``vnetd provision``."""
    parser = build_parser()
    return [
        parser.parse_args(container["args"])
        for job in objects
        if job["kind"] == "Job"
        for container in job["spec"]["template"]["spec"]["containers"]
        if container.get("args", [])[:1] == ["provision"]
    ]


@pytest.mark.parametrize("directory", etcd_compositions(), ids=rel)
def test_shipped_etcd_has_auth_turned_on(directory: Path):
    """Every deployment that ships etcd ships the Job that turns its auth on (``vnetd
    provision --enable-auth`` as root, no spec needed), and each mesh in it a Job that
    makes the user its spec runs as, before or after auth is on (``check_provision``
    checks the files and Secrets)."""
    objects = compose(directory)
    runs = provision_argvs(objects)
    assert any(a.enable_auth and a.config is None and a.etcd_user == "root" for a in runs)
    specs = {
        c["metadata"]["name"]: parse_spec(tomllib.loads(c["data"]["mesh.toml"]))
        for c in objects
        if c["kind"] == "ConfigMap" and "mesh.toml" in c.get("data", {})
    }
    for name, spec in specs.items():
        mine = [a for a in runs if a.config is not None and a.enable_auth]
        jobs = [
            j
            for j in objects
            if j["kind"] == "Job"
            and any(v.get("configMap", {}).get("name") == name
                    for v in j["spec"]["template"]["spec"].get("volumes", []))
            and j["spec"]["template"]["spec"]["containers"][0].get("args", [])[:1] == ["provision"]
        ]  # fmt: skip
        assert mine and len(jobs) == 1, f"{rel(directory)}: no provisioning Job for {name}"
        made = {u.name for u in plan_of(mine[0], spec).users}
        assert spec.registry.username in made, (name, spec.registry.username, made)


def test_peer_port_takes_only_the_peer_cas_certificate_with_its_cn():
    """The peer CA (a second self-signed CA) issues the peer certificate and nothing
    else; client and server certificates stay on the client CA, whose certificates are
    therefore no peer; ``--peer-cert-allowed-cn`` is the peer certificate's CN."""
    objects = compose(MANIFESTS / "overlays" / "etcd")
    certs = {o["spec"]["secretName"]: o for o in objects if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Issuer"}

    def ca_of(cert: Obj) -> Obj:
        return certs[issuers[cert["spec"]["issuerRef"]["name"]]["ca"]["secretName"]]

    peer, server = certs["etcd-peer-tls"], certs["etcd-server-tls"]
    peer_ca, client_ca = ca_of(peer), ca_of(server)
    assert peer_ca is not client_ca
    for ca in (peer_ca, client_ca):
        assert ca["spec"]["isCA"] and "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]
    assert ca_of(certs["vnetd-etcd-client-tls"]) is client_ca
    leaves = [c for c in certs.values() if not c["spec"].get("isCA")]
    assert [c for c in leaves if ca_of(c) is peer_ca] == [peer]
    flags = etcd_flags(MANIFESTS / "overlays" / "etcd")
    assert flags["peer-cert-allowed-cn"] == peer["spec"]["commonName"] == "etcd-peer"
    assert "peer-cert-allowed-hostname" not in flags  # etcd refuses both at once


def duration(text: str) -> float:
    """A Go duration of one unit (``10m``, ``1h``, ``300s``) in seconds."""
    match = re.fullmatch(r"(\d+)(s|m|h)", text)
    assert match, text
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def test_history_is_compacted_within_the_registrys_resume_windows_and_quota_kept():
    """Periodic compaction keeps ``R`` of history: short, so history alone fills the quota
    only at a writer's rate over R; but a revision lives at least R, and a paged list
    resumes at its revision within ``RESUME_WITHIN``, a 1024-member mesh's watch restart
    resumes after ``spaced(60, 1024, WATCH_RESTARTS)``: both within R, with room."""
    flags = etcd_flags(MANIFESTS / "etcd")
    assert flags["auto-compaction-mode"] == "periodic"
    retention = duration(flags["auto-compaction-retention"])
    assert retention >= 2 * RESUME_WITHIN
    assert retention >= 2 * spaced(60.0, 1024, WATCH_RESTARTS)
    assert retention <= 900, "history beyond 15 minutes serves no resume"
    assert int(flags["quota-backend-bytes"]) == 512 * 1024 * 1024
    assert (
        f"--auto-compaction-retention={flags['auto-compaction-retention']}"
        in (ROOT / "docs" / "operations.md").read_text()
    )


def test_etcd_quota_is_alerted_on_as_documented(tmp_path: Path):
    """components/etcd-monitoring alerts on the database against its quota (etcd 3.5 has
    no NOSPACE gauge), each alert named in docs/operations.md; promtool accepts them."""
    docs = load_documents(MANIFESTS / "components" / "etcd-monitoring" / "monitoring.yaml")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (group,) = rule["spec"]["groups"]
    ratio = "(etcd_mvcc_db_total_size_in_bytes / etcd_server_quota_backend_bytes) * 100"
    operations = (ROOT / "docs" / "operations.md").read_text()
    thresholds = []
    for alert in group["rules"]:
        assert alert["expr"].startswith(f"{ratio} > "), alert
        thresholds.append(int(alert["expr"].rpartition("> ")[2]))
        assert alert["alert"] in operations, f"docs/operations.md does not name {alert['alert']}"
    assert thresholds == [80, 95]
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool is not installed: the etcd rules were checked against the schema only")
        return
    rules = tmp_path / "etcd.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "SUCCESS: 2 rules found" in result.stdout, result


def shell_commands(walkthrough_only: bool = False) -> list[str]:
    """The docs' shell commands in order, continuations joined; or only the walk-through's."""
    text = DOC.read_text()
    if walkthrough_only:
        text = text.split("\n## Walk-through", 1)[1].split("\n## ", 1)[0]
    else:
        text += (MANIFESTS / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def walkthrough() -> list[str]:
    return shell_commands(walkthrough_only=True)


def test_walkthrough_names_its_commands_in_order():
    programs = [shlex.split(c)[0] for c in shell_commands()]
    assert set(programs) <= {"vnetd", "kubectl", "docker", "flux", "openssl"}, programs
    steps = [
        "vnetd render manifests",
        "kubectl -n vnetd apply",
        "vnetd wait",
        "kubectl -n vnetd logs",
        "kubectl -n vnetd wait --for=condition=complete",
    ]
    commands = walkthrough()
    positions = []
    for words in steps:
        found = [i for i, command in enumerate(commands) if words in command]
        assert found, f"the walk-through has no {words} ..."
        positions.append(found[0])
    assert positions == sorted(positions), "the steps are out of order"


def vnetd_argvs() -> list[list[str]]:
    argvs = []
    for command in shell_commands():
        words = shlex.split(command)
        if words[0] == "kubectl" and "--" in words:
            words = words[words.index("--") + 1 :]
        if words[0] == "vnetd":
            argvs.append(words[1:])
    return argvs


@pytest.mark.parametrize("argv", vnetd_argvs(), ids=shlex.join)
def test_doc_vnetd_commands_exist(argv: list[str]):
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"vnetd {shlex.join(argv)} does not parse")
    for word in argv:
        if word.startswith(("manifests/", "examples/")):
            assert (ROOT / word).exists(), word


@pytest.mark.parametrize(
    "command", [c for c in shell_commands() if c.startswith("kubectl ")], ids=lambda c: c
)
def test_doc_kubectl_commands_exist(command: str):
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word in {"-k", "-f"} and words[i + 1].startswith("manifests/"):
            assert (ROOT / words[i + 1]).exists(), words[i + 1]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("kubectl is not installed: its commands were not checked")
        pytest.skip("kubectl is not installed")
    if "--" in words:
        words = words[: words.index("--")]
    result = subprocess.run(
        [kubectl, *words[1:], "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{command}: {result.stderr.strip()}"


def test_manual_tls_commands_make_what_etcd_and_vnetd_need(tmp_path: Path):
    """The documented openssl commands (etcd over TLS by hand, the relays' certificate, the
    passwords) run, and make the client CA with a server, a client and a relay
    certificate, and the peer CA with the peer certificate (CN etcd-peer, not verifiable
    with the client CA), with the names and usages the manifests use; each password file
    is made."""
    if shutil.which("openssl") is None:
        print("openssl is not installed: the manual TLS commands were not run")
        pytest.skip("openssl is not installed")
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.x509.oid import ExtendedKeyUsageOID

    commands = [c for c in shell_commands() if c.startswith("openssl ")]
    assert len([c for c in commands if not c.startswith("openssl rand ")]) == 10
    for command in commands:
        result = subprocess.run(
            shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{command}: {result.stderr}"
    for command in commands:
        if command.startswith("openssl rand "):
            made = tmp_path / shlex.split(command)[shlex.split(command).index("-out") + 1]
            assert len(made.read_text().strip()) >= 32, command
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    peer_ca = x509.load_pem_x509_certificate((tmp_path / "peer-ca.crt").read_bytes())
    for authority in (ca, peer_ca):
        assert authority.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert peer_ca.subject != ca.subject
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    expected = {
        "server": (
            {"etcd-client", "etcd-0.etcd", "etcd-1.etcd", "etcd-2.etcd", "localhost"},
            {server, client},
        ),
        "peer": ({"etcd-0.etcd", "etcd-1.etcd", "etcd-2.etcd"}, {server, client}),
        "client": ({"vnetd-etcd-client"}, {client}),
        # The relays' (docs/kubernetes.md, "Relays"): the Service's name, as the daemons
        # reach it, under etcd's CA, which they verify it with.
        "relay": ({"flux-sample-relay"}, {server}),
    }
    for name, (names, usages) in expected.items():
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.crt").read_bytes())
        issuer, other = (peer_ca, ca) if name == "peer" else (ca, peer_ca)
        assert cert.issuer == issuer.subject
        issuer.public_key().verify(  # type: ignore[union-attr,call-arg]
            cert.signature, cert.tbs_certificate_bytes, cert.signature_algorithm_parameters
        )
        with pytest.raises(InvalidSignature):
            other.public_key().verify(  # type: ignore[union-attr,call-arg]
                cert.signature, cert.tbs_certificate_bytes, cert.signature_algorithm_parameters
            )
        assert set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == usages
        if names:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert set(sans.get_values_for_type(x509.DNSName)) == names
        assert (tmp_path / f"{name}.key").exists()
    # No CN: etcd 3.4's gateway refuses a client certificate with one once auth is on.
    client_cert = x509.load_pem_x509_certificate((tmp_path / "client.crt").read_bytes())
    assert len(client_cert.subject) == 0
    peer_cert = x509.load_pem_x509_certificate((tmp_path / "peer.crt").read_bytes())
    (cn,) = peer_cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    assert cn.value == etcd_flags(MANIFESTS / "etcd")["peer-cert-allowed-cn"]


def test_etcd_monitoring_scrapes_the_metrics_port_it_opens():
    """components/etcd-monitoring: its ServiceMonitor selects its Service, whose port is
    the members' metrics port, and its NetworkPolicy opens that port to Prometheus."""
    docs = load_documents(MANIFESTS / "components" / "etcd-monitoring" / "monitoring.yaml")
    by_kind = {d["kind"]: d for d in docs}
    service, monitor = by_kind["Service"], by_kind["ServiceMonitor"]
    policy = by_kind["NetworkPolicy"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    (stateful,) = load_documents(MANIFESTS / "etcd" / "statefulset.yaml")
    (member,) = stateful["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in member["ports"]}
    assert service["spec"]["ports"] == [{"name": "metrics", "port": ports["metrics"],
                                         "targetPort": "metrics"}]  # fmt: skip
    members = stateful["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= members
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= members
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
