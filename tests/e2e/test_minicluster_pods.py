"""A rendered MiniCluster's pods run in the lab as the Flux Operator runs them, and complete.

``vnetd render minicluster`` output is turned into the pod the operator's
controller makes of it (``operator_pod``: controllers/flux ``getVolumes``,
``getVolumeMounts``, ``getContainers``): the Flux view's ``emptyDir`` at
``/mnt/flux`` in every container, the entrypoint ConfigMap at
``/flux_operator``, each container's ``volumes`` (the spec's ConfigMap, the
node's ``/dev/net``, the etcd client Secret mounted 0644), the security
context as given, and ``/bin/bash /flux_operator/<script>`` as the command.
The scripts are stand-ins for the operator's templates: ``start-1.sh`` is
start.sh's shape (the Flux view's ``PYTHONPATH`` exported, then the
container's ``command`` inserted as a line); ``wait-0.sh`` runs
``commands.pre`` (the ``/readyz`` wait), a job (every rank's overlay address
answers a ping), waits for the test's go, then touches the completion marker
as wait.sh does once its broker has exited. No ``POD_IP``: the operator
passes literal values only, so each pod has a default route (to an address
nobody holds on the lab's bridge) whose address vnetd takes as its endpoint.

Done when every container exits 0 (the pod would reach Succeeded under
``restartPolicy: OnFailure``), each rank's lease is revoked on the way out,
and a rank that ends first is dropped by its peers at once, long before its
lease would expire.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kube_pods import KubePod, by_kind, shim_directory, start_pod
from test_k8s_entrypoints import PATH, job_pod_of, run_auth_jobs, start_tls_etcd, wait_exit

from vnetd.lab.open_lab import Lab, open_lab
from vnetd.render.minicluster import OPERATOR_MARKER, MiniClusterOptions, render_minicluster
from vnetd.render.provision_job import render_provision
from vnetd.spec import load_spec

ROOT = Path(__file__).parents[2]
SPEC = ROOT / "manifests" / "sidecar" / "mesh.toml"
SIZE = 3
LEASE_TTL = 30
"""Long, so that a peer dropping a finished rank within DROP_BOUND shows the revocation."""
DROP_BOUND = 5.0
GATEWAY = "198.18.0.1"
"""On the lab's bridge, held by no namespace: a default route that goes nowhere."""
VIEW = "/mnt/flux"
GO = "job-may-end"
"""Created by the test in a pod's Flux view: its job stand-in may end."""
Obj = dict[str, Any]


def render(tmp_path: Path, gate_timeout: int | None = None) -> tuple[Obj, Obj, Obj]:
    """The spec beside the sidecar example, resized, rendered as a MiniCluster, and the
    pod of its provisioning Job (``vnetd render provision``)."""
    text = SPEC.read_text().replace("size = 4 ", f"size = {SIZE} ")
    text = text.replace("lease_ttl = 10", f"lease_ttl = {LEASE_TTL}")
    assert f"size = {SIZE}" in text and f"lease_ttl = {LEASE_TTL}" in text
    path = tmp_path / "mesh.toml"
    path.write_text(text)
    docs = by_kind(list(yaml.safe_load_all(render_minicluster(
        load_spec(path), text,
        MiniClusterOptions(image="harbor.test/hpc/vnetd:0.1.0", gate_timeout=gate_timeout),
    ))))  # fmt: skip
    (config_map,) = docs["ConfigMap"]
    (minicluster,) = docs["MiniCluster"]
    return config_map, minicluster, job_pod_of(render_provision(load_spec(path)))


def job_script(minicluster: Obj) -> str:
    """wait-0.sh's stand-in: pre, a job over the overlay, the go, then the marker."""
    flux = minicluster["spec"]["containers"][0]
    addresses = " ".join(f"10.250.0.{rank + 1}" for rank in range(SIZE))
    return f"""#!/bin/bash
{flux["commands"]["pre"]}
for address in {addresses}; do
  tries=0
  # An absent rank fails at once ("No route to host"): retry every 0.5 s, 60 s in all.
  until ping -c1 -W1 "$address" >/dev/null; do
    tries=$((tries + 1)); [ "$tries" -lt 120 ] || {{ echo "no answer from $address"; exit 1; }}
    sleep 0.5
  done
done
echo "job ran on $(hostname): every rank answers"
for _ in $(seq 600); do [ -e {VIEW}/{GO} ] && break; sleep 0.2; done
[ -e {VIEW}/{GO} ] || {{ echo "no go"; exit 1; }}
{flux["commands"].get("post", "")}
touch {OPERATOR_MARKER}
"""


def start_script(container: Obj) -> str:
    """start-1.sh's stand-in: the view's Python on PYTHONPATH, then the command line."""
    return (
        "#!/bin/sh\n"
        f'export PYTHONPATH="${{PYTHONPATH:-}}:{VIEW}/view/lib/python3.11/site-packages"\n'
        f"{container['command']}\n"
        f"{container.get('commands', {}).get('post', '')}\n"
    )


def operator_pod(minicluster: Obj, job: str | None = None) -> tuple[Obj, Obj]:
    """The pod spec the operator makes of ``minicluster`` and its entrypoint ConfigMap;
    ``job``: the Flux container's script (default ``job_script``)."""
    name = minicluster["metadata"]["name"]
    body = minicluster["spec"]
    assert body["flux"]["noWaitSocket"] is True, "else start.sh waits for Flux's socket"
    flux, *others = body["containers"]
    assert flux["runFlux"] and not any(other.get("runFlux") for other in others)
    entrypoint = f"{name}-entrypoint"
    mounts: list[Obj] = [
        {"name": "flux-view", "mountPath": VIEW},
        {"name": entrypoint, "mountPath": "/flux_operator", "readOnly": True},
    ]
    volumes: list[Obj] = [
        {"name": "flux-view", "emptyDir": {}},
        # The operator sets mode 0777 per item; materialize_volumes knows defaultMode.
        {"name": entrypoint, "configMap": {"name": entrypoint, "defaultMode": 0o755}},
    ]
    containers = []
    for index, container in enumerate(body["containers"]):
        for volume_name, volume in container.get("volumes", {}).items():
            mounts = [*mounts, {"name": volume_name, "mountPath": volume["path"],
                                "readOnly": volume.get("readOnly", False)}]  # fmt: skip
            if "configMapName" in volume:
                items = [{"key": k, "path": p} for k, p in volume["items"].items()]
                source = {"configMap": {"name": volume["configMapName"], "items": items}}
            elif "hostPath" in volume:
                source = {"hostPath": {"path": volume["hostPath"], "type": "Directory"}}
            else:
                source = {"secret": {"secretName": volume["secretName"]}}  # 0644: no mode
            volumes.append({"name": volume_name, **source})
        script = f"wait-{index}.sh" if container.get("runFlux") else f"start-{index}.sh"
        security = container.get("securityContext") or {
            # The application's stand-in: root (as ubuntu's image runs), only ping's capability.
            "runAsUser": 0, "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]},
        }  # fmt: skip
        containers.append({
            "name": name if container.get("runFlux") else container["name"],
            "image": container["image"],
            "command": ["/bin/bash", f"/flux_operator/{script}"],
            "securityContext": security,
            "volumeMounts": mounts,  # the operator's list grows from container to container
        })  # fmt: skip
    scripts = {f"start-{i}.sh": start_script(c) for i, c in enumerate(others, start=1)}
    data = {"wait-0.sh": job_script(minicluster) if job is None else job, **scripts}
    config_map = {"metadata": {"name": entrypoint}, "data": data}
    spec = {"restartPolicy": "OnFailure", "containers": containers, "volumes": volumes}
    return spec, config_map


async def route_ranks(lab: Lab, kube: KubePod) -> set[int]:
    """The ranks with a host route on the pod's overlay interface (one per present peer)."""
    result = await lab.run(kube.pod, ["ip", "-o", "route", "show", "dev", "vnet0"])
    words = [line.split()[0] for line in result.stdout.decode().splitlines()]
    return {int(w.split(".")[-1]) - 1 for w in words if w.startswith("10.250.0.")}


@pytest.fixture
def shims() -> Any:  # noqa: ANN401 - the shim directory's iterator
    with shim_directory("vnetd-minicluster-shims-") as directory:
        yield directory


async def operator_pods(
    lab: Lab, tmp_path: Path, shims: Path, rendered: tuple[Obj, Obj, Obj]
) -> list[KubePod]:
    """etcd, the provisioning Jobs, then the MiniCluster's pods with no container started
    (each with its default route); the last two lab pods run etcd's Jobs."""
    config_map, minicluster, provisioning = rendered
    spec, entrypoints = operator_pod(minicluster)
    name = minicluster["metadata"]["name"]
    config_maps = {m["metadata"]["name"]: m for m in (config_map, entrypoints)}
    secrets = await start_tls_etcd(lab, tmp_path)
    await run_auth_jobs(lab, lab.pods[SIZE:], shims, provisioning, config_maps, secrets)
    pods: list[KubePod] = []
    for index, pod in enumerate(lab.pods[:SIZE]):
        added = await lab.run(pod, ["ip", "route", "add", "default", "via", GATEWAY])
        assert added.returncode == 0, added.stderr.decode()
        pods.append(await start_pod(
            lab, pod, spec, hostname=f"{name}-{index}", fields={},
            extra_env={"PATH": f"{shims}:{PATH}", "JOB_COMPLETION_INDEX": str(index)},
            config_maps=config_maps, secrets=secrets,
        ))  # fmt: skip
    return pods


async def test_a_batch_minicluster_completes_and_each_rank_leaves_at_once(
    shims: Path, tmp_path: Path
):
    rendered = render(tmp_path)
    name = rendered[1]["metadata"]["name"]
    with trio.fail_after(300):
        async with open_lab(SIZE + 2, with_etcd=False) as lab:
            pods = await operator_pods(lab, tmp_path, shims, rendered)
            for kube in pods:  # the operator's containers start together
                await kube.start("vnetd")
                await kube.start(name)
            view = {k.pod.index: k.pod.dir / "kube" / "volumes" / "flux-view" for k in pods}
            with trio.fail_after(120):
                while not all("job ran on" in k.running[name].log_text() for k in pods):
                    assert all(k.running[name].returncode is None for k in pods), [
                        k.running[name].log_text() for k in pods
                    ]
                    await trio.sleep(0.2)
            for index, kube in enumerate(pods):
                assert await route_ranks(lab, kube) == set(range(SIZE)) - {index}

            # The last rank's job ends first: its pod completes, and its peers drop it
            # at once (the lease is revoked), not after the 30 s TTL.
            last = pods[-1]
            (view[SIZE - 1] / GO).touch()
            assert await wait_exit(last.running[name], 30) == 0, last.running[name].log_text()
            assert await wait_exit(last.running["vnetd"], 10) == 0, last.running["vnetd"].log_text()
            with trio.fail_after(DROP_BOUND):
                for kube in pods[:-1]:
                    while SIZE - 1 in await route_ranks(lab, kube):
                        await trio.sleep(0.1)
            registered = await lab.etcdctl("get", "--prefix", "--keys-only", "/vnetd/")
            assert f"members/{SIZE - 1}" not in registered.stdout.decode()

            # Then the rest, as when rank 0's instance ends.
            for index in range(SIZE - 1):
                (view[index] / GO).touch()
            for kube in pods[:-1]:
                for container in (name, "vnetd"):
                    process = kube.running[container]
                    assert await wait_exit(process, 30) == 0, process.log_text()
            registered = await lab.etcdctl("get", "--prefix", "--keys-only", "/vnetd/")
            assert "members/" not in registered.stdout.decode(), "every lease revoked"
            for kube in pods:
                log = kube.running["vnetd"].log_text()
                assert f"{OPERATOR_MARKER} exists: the job is done" in log, log
                assert "lease revoked" in log and "Traceback" not in log
                assert "vnetd ready" in kube.running[name].log_text()
                assert "vnetd gate open: rank " in kube.running[name].log_text()
