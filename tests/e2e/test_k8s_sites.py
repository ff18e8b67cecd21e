"""The pods ``vnetd render manifests --site --ranks`` writes, run in the lab as the kubelet would.

A 4-rank mesh of two sites: site a's part (ranks 0-1, gateway 0) is an
Indexed Job, site b's (ranks 2-3, gateway 2) a StatefulSet whose ordinals
start at 2. Every pod runs its forwarding init container and its vnetd
sidecar with the rendered command, env (``$(VNETD_POD_INDEX)`` from the
Job's index annotation or the StatefulSet's pod-index label) and volumes
(``kube_pods``); the gateways' public endpoint files are filled in as
``kubectl patch`` would. Then the two non-gateway ranks reach each other
across the sites, which takes both gateways forwarding. The lab's pods share
one bridge (no NAT): what the NAT lab shows is in ``test_sites.py``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml
from kube_pods import KubePod, by_kind, shim_directory, start_pod

from vnetd.control.membership import member_key
from vnetd.control.proof import create_signer_file
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.spec import parse_spec

SPEC = """\
[mesh]
name = "burst"
size = 4
network = "10.252.0.0/24"

[registry]
endpoints = ["http://etcd-client:2379"]
lease_ttl = 5

[sites.a]
gateways = [0]

[sites.b]
gateways = [2]
"""
PARTS = {"a": "0-1", "b": "2-3"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT = Path(__file__).parents[2]
INDEX_FIELDS = (
    "metadata.annotations['batch.kubernetes.io/job-completion-index']",
    "metadata.labels['apps.kubernetes.io/pod-index']",
)


@pytest.fixture
def vnetd_shim() -> Iterator[Path]:
    """``vnetd`` (this checkout) on PATH, readable by any user."""
    with shim_directory("vnetd-kube-sites-") as directory:
        yield directory


def part(site: str, spec_text: str = SPEC) -> dict[str, list[dict]]:
    options = ManifestOptions(site=site, ranks=PARTS[site])
    text = render_manifests(parse_spec(tomllib.loads(spec_text)), spec_text, options)
    return by_kind(list(yaml.safe_load_all(text)))


async def sysctl(kube: KubePod, name: str) -> str:
    result = await kube.lab.run(kube.pod, ["cat", f"/proc/sys/{name}"], beside=kube.sandbox)
    return result.stdout.decode().strip()


async def start_parts(
    lab: Lab,
    vnetd_shim: Path,
    spec_text: str = SPEC,
    secrets: dict[str, dict[str, bytes]] | None = None,
) -> tuple[list[KubePod], dict[int, str]]:
    """Both sites' rendered pods, each with its init containers run (forwarding checked)
    and its vnetd sidecar started; with what each ``vnetd-signing-key`` said, by rank."""
    parts = {site: part(site, spec_text) for site in PARTS}
    assert [w["kind"] for w in parts["a"]["Job"]] == ["Job"]
    (stateful,) = parts["b"]["StatefulSet"]
    assert stateful["spec"]["ordinals"] == {"start": 2}
    templates = {"a": parts["a"]["Job"][0], "b": stateful}
    pods: list[KubePod] = []
    for rank, pod in enumerate(lab.pods):
        site = "a" if rank < 2 else "b"
        spec = templates[site]["spec"]["template"]["spec"]
        config_maps = {c["metadata"]["name"]: c for c in parts[site]["ConfigMap"]}
        # kubectl patch: the gateways' load balancers are their own addresses here.
        public = config_maps["burst-vnetd-public"]["data"]
        if rank in (0, 2):
            public[str(rank)] = f"{pod.underlay_ip}:51820"
        extra = {"PATH": f"{vnetd_shim}:{PATH}"}
        if site == "a":
            extra["JOB_COMPLETION_INDEX"] = str(rank)
        name = f"burst-{rank}-x{rank}" if site == "a" else f"burst-{rank}"
        pods.append(await start_pod(
            lab, pod, spec, hostname=f"burst-{rank}",
            fields={"status.podIP": pod.underlay_ip, "metadata.name": name,
                    INDEX_FIELDS[0]: str(rank), INDEX_FIELDS[1]: str(rank)},
            extra_env=extra, config_maps=config_maps,
            secrets={"burst-curve-cert": {"curve.cert": b"unused\n"}, **(secrets or {})},
        ))  # fmt: skip
    copied: dict[int, str] = {}
    for rank, kube in enumerate(pods):
        forwarding = await kube.run_to_end("vnetd-forwarding")
        assert forwarding.returncode == 0, forwarding.stderr.decode()
        said = forwarding.stdout.decode()
        assert ("forwarding: on" in said) == (rank in (0, 2)), said
        assert await sysctl(kube, "net/ipv4/ip_forward") == str(int(rank in (0, 2)))
        if any(c["name"] == "vnetd-signing-key" for c in kube.spec["initContainers"]):
            copy = await kube.run_to_end("vnetd-signing-key")
            assert copy.returncode == 0, copy.stderr.decode()
            copied[rank] = copy.stdout.decode()
        await kube.start("vnetd")
    return pods, copied


async def reach_across(lab: Lab, pods: list[KubePod]) -> None:
    """Ranks 1 (site a) and 3 (site b) are not gateways: 1 -> 0 -> 2 -> 3 and back."""
    with trio.fail_after(90):
        for source, target in ((1, 3), (3, 1), (0, 2)):
            argv = ["ping", "-c1", "-W1", f"10.252.0.{target + 1}"]
            while (await lab.run(pods[source].pod, argv)).returncode:
                await trio.sleep(0.2)


async def test_two_sites_rendered_parts_form_one_mesh_through_their_gateways(vnetd_shim: Path):
    with trio.fail_after(180):
        async with open_lab(4) as lab:
            pods, copied = await start_parts(lab, vnetd_shim)
            assert copied == {}
            await reach_across(lab, pods)
            # Through the gateways, not around them: each non-gateway's own gateway's peer
            # holds the other site's addresses.
            for rank, via in ((1, 0), (3, 2)):
                kube = pods[rank]
                argv = ["wg", "show", "vnet0", "allowed-ips"]
                shown = await lab.run(kube.pod, argv, beside=kube.sandbox)
                assert shown.returncode == 0, shown.stderr.decode()
                (peers,) = [line for line in shown.stdout.decode().splitlines()
                            if f"10.252.0.{via + 1}/32" in line]  # fmt: skip
                assert sorted(peers.split()[1:]) == [f"10.252.0.{r + 1}/32" for r in range(4)
                                                     if r != rank], peers  # fmt: skip
            for rank, kube in enumerate(pods):
                log = kube.running["vnetd"].log_text()
                assert kube.running["vnetd"].returncode is None, log
                assert "Traceback" not in log, log
                if rank in (0, 2):
                    assert f"{lab.pods[rank].underlay_ip}:51820" in log, log


async def test_a_pinned_gateway_signs_with_the_key_its_secret_holds(
    vnetd_shim: Path, tmp_path: Path
) -> None:
    """Site b pins gateway 2's signing key, made with ``vnetd signing-key --create
    --key-file`` and given as the Secret ``vnetd-gateway-signing-keys``. The rendered
    init container copies it into gateway 2's (new, empty) state dir and nothing into
    rank 3's; gateway 2 claims under the pinned key (without it, a fresh state dir's
    key would make it exit 2) and the sites reach each other through it."""
    key_file = tmp_path / "gateway-2.key"
    pinned = create_signer_file(key_file, "--key-file").public_key
    pin = f'gateway_keys = {{ 2 = "{pinned}" }}\n'
    text = SPEC.replace("[sites.b]\ngateways = [2]\n", f"[sites.b]\ngateways = [2]\n{pin}")
    assert parse_spec(tomllib.loads(text)).pinned_key(2) == pinned
    secrets = {"vnetd-gateway-signing-keys": {"gateway-2.key": key_file.read_bytes()}}
    with trio.fail_after(180):
        async with open_lab(4) as lab:
            pods, copied = await start_parts(lab, vnetd_shim, text, secrets)
            assert "rank 2's pinned key from the Secret" in copied[2], copied
            assert "none in the Secret for rank 3" in copied[3], copied
            await reach_across(lab, pods)
            key = member_key(parse_spec(tomllib.loads(text)), 2)
            entry = await lab.etcdctl("get", "--print-value-only", key)
            assert json.loads(entry.stdout)["signing_key"] == pinned
            for kube in pods:
                assert kube.running["vnetd"].returncode is None, kube.running["vnetd"].log_text()
