"""Two rendered MiniClusters, ``--site a --ranks 0-1`` and ``--site b --ranks 2-3``, form one
mesh through their gateways in the lab, run as the Flux Operator runs their pods.

The spec is ``test_k8s_sites``' (gateways 0 and 2). Each MiniCluster is
named ``burst`` and its pods are an Indexed Job from index 0, so both sites'
pods have host names ``burst-0`` and ``burst-1`` (two clusters): site b's
vnetd takes rank ``2 + JOB_COMPLETION_INDEX`` and its Flux container's
``pre`` exports ``FLUX_FAKE_HOSTNAME=burst-<rank>``. The pods are
``test_minicluster_pods.operator_pod``'s (the operator's volumes, scripts and
security contexts), with three containers where the site has a gateway (the
privileged ``vnetd-forwarding``); the gateways' public endpoint files are
filled in as ``kubectl patch`` would. The Flux container's job is a broker
stand-in (``zmq_broker.py``, which finds its rank as flux-core does, by
``FLUX_FAKE_HOSTNAME`` where set) on the rendered ``brokerConfig``, written
where the operator's view writes it.

Done when rank 0's broker hears from ranks 1, 2 and 3, one process each (site
b's Job index 0, the operator's "main host", is rank 2), the non-gateway ranks
1 and 3 ping each other through both gateways, and every container exits 0
once the job ends. The pods share one bridge (no NAT: ``test_sites.py``).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kube_pods import KubePod, by_kind, shim_directory, start_pod
from test_k8s_entrypoints import PATH, wait_exit
from test_k8s_sites import SPEC, reach_across, sysctl
from test_minicluster_pods import GATEWAY, OPERATOR_MARKER, VIEW, operator_pod

from vnetd.lab.open_lab import open_lab
from vnetd.render.minicluster import MiniClusterOptions, render_minicluster
from vnetd.spec import parse_spec

PARTS = {"a": (0, 1), "b": (2, 3)}
GATEWAYS = (0, 2)
BROKER = Path(__file__).with_name("zmq_broker.py")
BROKER_CONFIG = "config/etc/flux/config/broker.toml"
"""Where the operator's view writes the broker config, under the Flux view."""
GO = "job-may-end"
Obj = dict[str, Any]


def render(site: str) -> dict[str, list[Obj]]:
    first, last = PARTS[site]
    options = MiniClusterOptions(image="harbor.test/hpc/vnetd:0.1.0", site=site,
                                 ranks=f"{first}-{last}")  # fmt: skip
    text = render_minicluster(parse_spec(tomllib.loads(SPEC)), SPEC, options)
    return by_kind(list(yaml.safe_load_all(text)))


def job(minicluster: Obj) -> str:
    """wait-0.sh's stand-in: pre, then the broker until the test's go, then the marker."""
    pre = minicluster["spec"]["containers"][0]["commands"]["pre"]
    return f"""#!/bin/bash
{pre}
echo "broker host: ${{FLUX_FAKE_HOSTNAME:-$(hostname)}}"
{sys.executable} {BROKER} {VIEW}/{BROKER_CONFIG} --duration 120 &
broker=$!
for _ in $(seq 600); do [ -e {VIEW}/{GO} ] && break; sleep 0.2; done
kill "$broker"; wait "$broker"
touch {OPERATOR_MARKER}
"""


def hellos(log: str) -> dict[int, set[str]]:
    """Rank 0's broker's log: the boot ids it heard a hello from, by rank."""
    heard: dict[int, set[str]] = {}
    for line in log.splitlines():
        if line.startswith("{") and '"hello"' in line:
            record = json.loads(line)
            heard.setdefault(record["rank"], set()).add(record["boot"])
    return heard


@pytest.fixture
def shims() -> Any:  # noqa: ANN401 - the shim directory's iterator
    with shim_directory("vnetd-minicluster-sites-") as directory:
        yield directory


async def test_two_minicluster_sites_form_one_mesh_through_their_gateways(shims: Path):
    rendered = {site: render(site) for site in PARTS}
    pods: list[KubePod] = []
    with trio.fail_after(240):
        async with open_lab(4) as lab:
            for site, (first, last) in PARTS.items():
                (minicluster,) = rendered[site]["MiniCluster"]
                assert (minicluster["spec"]["size"], minicluster["spec"]["maxSize"]) == (2, 2)
                assert [s["metadata"]["name"] for s in rendered[site]["Service"]] == [
                    f"burst-gateway-{first}"
                ]
                spec, entrypoints = operator_pod(minicluster, job(minicluster))
                config_maps = {m["metadata"]["name"]: m for m in rendered[site]["ConfigMap"]}
                config_maps[entrypoints["metadata"]["name"]] = entrypoints
                # kubectl patch: the gateway's load balancer is its own address here.
                public = config_maps["burst-vnetd-public"]["data"]
                public[str(first)] = f"{lab.pods[first].underlay_ip}:51820"
                for rank in range(first, last + 1):
                    index = rank - first
                    # No POD_IP: vnetd's endpoint is its default route's address.
                    argv = ["ip", "route", "add", "default", "via", GATEWAY]
                    added = await lab.run(lab.pods[rank], argv)
                    assert added.returncode == 0, added.stderr.decode()
                    kube = await start_pod(
                        lab, lab.pods[rank], spec, hostname=f"burst-{index}", fields={},
                        extra_env={"PATH": f"{shims}:{PATH}", "JOB_COMPLETION_INDEX": str(index)},
                        config_maps=config_maps, secrets={},
                    )  # fmt: skip
                    view = lab.pods[rank].dir / "kube" / "volumes" / "flux-view"
                    (view / BROKER_CONFIG).parent.mkdir(parents=True)
                    (view / BROKER_CONFIG).write_text(minicluster["spec"]["flux"]["brokerConfig"])
                    pods.append(kube)
            for kube in pods:  # the operator's containers start together
                for container in kube.spec["containers"]:
                    await kube.start(container["name"])
            forwarding = [k.running["vnetd-forwarding"] for k in pods]
            for rank, process in enumerate(forwarding):
                assert await wait_exit(process, 30) == 0, process.log_text()
                said = process.log_text()
                assert ("forwarding: on" in said) == (rank in GATEWAYS), said
                assert await sysctl(pods[rank], "net/ipv4/ip_forward") == str(int(rank in GATEWAYS))
            try:
                await reach_across(lab, pods)
            except trio.TooSlowError:
                pytest.fail("\n".join(k.running["vnetd"].log_text()[-1500:] for k in pods))
            root = pods[0].running["burst"]
            with trio.fail_after(60):
                while set(hellos(root.log_text())) != {1, 2, 3}:
                    assert root.returncode is None, root.log_text()
                    await trio.sleep(0.2)
            assert all(len(boots) == 1 for boots in hellos(root.log_text()).values())
            for rank, kube in enumerate(pods):
                said = kube.running["burst"].log_text()
                assert f"broker host: burst-{rank}" in said, said
                assert "vnetd ready" in said, said
            for rank in range(len(pods)):
                (lab.pods[rank].dir / "kube" / "volumes" / "flux-view" / GO).touch()
            for kube in pods:
                for container in ("burst", "vnetd"):
                    process = kube.running[container]
                    assert await wait_exit(process, 30) == 0, process.log_text()
            registered = await lab.etcdctl("get", "--prefix", "--keys-only", "/vnetd/")
            assert "members/" not in registered.stdout.decode(), "every lease revoked"
