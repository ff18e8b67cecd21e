"""The relays ``vnetd render manifests --relays`` renders run in the lab as the kubelet
would run them (``kube_pods``), beside the Job's pods, on etcd as shipped (TLS, client
certificates, auth on by the Jobs ``etcd-auth`` and the mesh's provisioning Job, which
``render provision --relay-user`` makes the relays' user in).

etcd is reached over TLS, so the relay serves HTTPS with the certificate docs/kubernetes.md
("Relays") makes by hand, from the Secret the rendered pod mounts, and each daemon
verifies it with etcd's CA (a relay it cannot verify would serve no watch here).
The daemons start first and the relay beside them (one ``kubectl apply``): a daemon
that finds no relay reads etcd, and its member watch moves to the relay once it answers. The relay pod runs as the image's user
with only its own etcd user's password, which reads the mesh and writes nothing of it;
every daemon's member watch is served by it; the mesh forms as ``vnetd wait --ranks
all`` checks it.
"""

from __future__ import annotations

import re
from pathlib import Path

import trio
import yaml
from kube_pods import KubePod, by_kind, start_pod
from test_k8s_entrypoints import (
    CURVE_CERT,
    PATH,
    ROOT,
    job_pod_of,
    run_auth_jobs,
    shims,  # noqa: F401 (a fixture)
    start_tls_etcd,
    wait_for_every_rank,
)

from vnetd.control.membership import member_key
from vnetd.lab.cluster import http_get
from vnetd.lab.etcd import run_etcdctl
from vnetd.lab.open_lab import open_lab
from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.render.provision_job import render_provision
from vnetd.render.relays import RELAY_PORT, relay_name, relay_url
from vnetd.spec import load_spec

RELAY_USER = "vnetd-flux-sample-relay"
RELAY_READY = 30.0
"""The relay's start (a Python process on loaded cores) and its first list on etcd."""
MOVED = 20.0
"""From the mesh formed until every daemon's member watch is on the relay: a daemon that
found no relay rests them 5 s (``FIRST_REST``), then moves; below the 30 s rest and the
60 s periodic restart by which a watch moved before."""


async def relay_watchers(lab, pod, url: str) -> float:
    status, metrics = await http_get(lab, pod, f"{url}/metrics")
    assert status == 200, metrics
    found = re.search(r"^vnetd_relay_watchers (\S+)$", metrics, re.MULTILINE)
    assert found is not None, metrics
    return float(found.group(1))


async def test_rendered_relays_serve_every_daemon_of_the_job(shims: Path, tmp_path: Path):  # noqa: F811
    spec_path = ROOT / "manifests" / "sidecar" / "mesh.toml"
    spec, text = load_spec(spec_path), spec_path.read_text()
    options = ManifestOptions(relays=1, relay_user=RELAY_USER)
    objects = by_kind(list(yaml.safe_load_all(render_manifests(spec, text, options))))
    (job,) = objects["Job"]
    (deployment,) = objects["Deployment"]
    pod_spec, relay_spec = job["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]
    provision = job_pod_of(render_provision(spec, relay_user=RELAY_USER))
    config_maps = {c["metadata"]["name"]: c for c in objects["ConfigMap"]}
    name, size = job["metadata"]["name"], job["spec"]["completions"]
    env = {"PATH": f"{shims}:{PATH}"}
    with trio.fail_after(240):
        async with open_lab(size + 3, with_etcd=False) as lab:
            secrets = await start_tls_etcd(lab, tmp_path)
            secrets[f"{name}-curve-cert"] = {"curve.cert": CURVE_CERT}
            # The relays' password as docs/kubernetes.md ("Relays") makes it.
            password = (tmp_path / RELAY_USER).read_bytes()
            secrets["vnetd-etcd-password"][RELAY_USER] = password
            _, made = await run_auth_jobs(lab, lab.pods[size : size + 2], shims, provision,
                                          config_maps, secrets)  # fmt: skip
            assert f"user {RELAY_USER}: created (relay)" in made.splitlines(), made
            relay_pod = lab.pods[size + 2]
            hosts = {relay_name(spec): relay_pod.underlay_ip}
            pods: list[KubePod] = []
            for index, pod in enumerate(lab.pods[:size]):
                pods.append(await start_pod(
                    lab, pod, pod_spec, hostname=f"{name}-{index}",
                    fields={"status.podIP": pod.underlay_ip,
                            "metadata.name": f"{name}-{index}-x{index}"},
                    extra_env={**env, "JOB_COMPLETION_INDEX": str(index)},
                    config_maps=config_maps, secrets=secrets, hosts=hosts,
                ))  # fmt: skip
            # As one `kubectl apply` starts them: the daemons first, the relay beside them.
            for kube in pods:
                await kube.run_to_end("flux-curve-cert")
                await kube.start("vnetd")
            relay = await start_pod(
                lab, relay_pod, relay_spec, hostname=f"{relay_name(spec)}-7d9f-x1",
                fields={}, extra_env=env, config_maps=config_maps, secrets=secrets,
            )  # fmt: skip
            relay_process = await relay.start("relay")
            assert relay_url(spec).startswith("https://")
            url = f"https://{relay_pod.underlay_ip}:{RELAY_PORT}"
            with trio.fail_after(RELAY_READY):
                while (await http_get(lab, relay_pod, f"{url}/healthz"))[0] != 200:
                    assert relay_process.returncode is None, relay_process.log_text()
                    await trio.sleep(0.2)
            await wait_for_every_rank(pods[0], shims)
            # A daemon that found no relay read etcd meanwhile; its member watch moves to
            # the relay once the first rest ends (5 s), not at its periodic restart.
            with trio.move_on_after(MOVED):
                while await relay_watchers(lab, relay_pod, url) != size:
                    await trio.sleep(0.5)
            assert await relay_watchers(lab, relay_pod, url) == size
            for kube in pods:
                daemon = kube.running["vnetd"].log_text()
                assert kube.running["vnetd"].returncode is None, daemon
                assert "Traceback" not in daemon, daemon
            log = relay_process.log_text()
            assert relay_process.returncode is None and "Traceback" not in log, log
            # The relays' credential reads the mesh and writes nothing of it.
            tls = [f for f in lab.etcdctl_flags if not f.startswith("root:") and f != "--user"]
            as_relay = [*tls, "--user", f"{RELAY_USER}:{password.decode().strip()}"]
            key = member_key(spec, 0)
            read = await run_etcdctl(lab.etcd_netns, [lab.etcd_url], ["get", key, "--keys-only"],
                                     flags=as_relay, timeout=20)  # fmt: skip
            assert read.returncode == 0 and key in read.stdout.decode(), read
            put = await run_etcdctl(lab.etcd_netns, [lab.etcd_url], ["put", key, "x"],
                                    flags=as_relay, timeout=20)  # fmt: skip
            assert put.returncode != 0 and b"permission denied" in put.stderr, put
