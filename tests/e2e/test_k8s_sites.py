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

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml
from kube_pods import KubePod, by_kind, shim_directory, start_pod

from vnetd.lab.open_lab import open_lab
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


def part(site: str) -> dict[str, list[dict]]:
    options = ManifestOptions(site=site, ranks=PARTS[site])
    text = render_manifests(parse_spec(tomllib.loads(SPEC)), SPEC, options)
    return by_kind(list(yaml.safe_load_all(text)))


async def sysctl(kube: KubePod, name: str) -> str:
    result = await kube.lab.run(kube.pod, ["cat", f"/proc/sys/{name}"], beside=kube.sandbox)
    return result.stdout.decode().strip()


async def test_two_sites_rendered_parts_form_one_mesh_through_their_gateways(vnetd_shim: Path):
    parts = {site: part(site) for site in PARTS}
    assert [w["kind"] for w in parts["a"]["Job"]] == ["Job"]
    (stateful,) = parts["b"]["StatefulSet"]
    assert stateful["spec"]["ordinals"] == {"start": 2}
    templates = {"a": parts["a"]["Job"][0], "b": stateful}
    with trio.fail_after(180):
        async with open_lab(4) as lab:
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
                    secrets={"burst-curve-cert": {"curve.cert": b"unused\n"}},
                ))  # fmt: skip
            for rank, kube in enumerate(pods):
                forwarding = await kube.run_to_end("vnetd-forwarding")
                assert forwarding.returncode == 0, forwarding.stderr.decode()
                said = forwarding.stdout.decode()
                assert ("forwarding: on" in said) == (rank in (0, 2)), said
                assert await sysctl(kube, "net/ipv4/ip_forward") == str(int(rank in (0, 2)))
                await kube.start("vnetd")
            # Ranks 1 (site a) and 3 (site b) are not gateways: 1 -> 0 -> 2 -> 3 and back.
            with trio.fail_after(90):
                for source, target in ((1, 3), (3, 1), (0, 2)):
                    argv = ["ping", "-c1", "-W1", f"10.252.0.{target + 1}"]
                    while (await lab.run(pods[source].pod, argv)).returncode:
                        await trio.sleep(0.2)
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
