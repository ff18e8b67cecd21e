"""The daemon seen from outside, in the lab: /readyz, /metrics, /status, JSON logs, no secrets.

Every HTTP request is made from inside the daemon's own pod to its loopback
address, as a kubelet probe or a Prometheus sidecar would.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

import trio
from bounds import REGISTRY_BACKOFF_MAX
from prometheus_client.parser import text_string_to_metric_families

from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.open_lab import Lab, LabProcess, Pod

PORT = 9090


async def get(lab: Lab, pod: Pod, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT<path> from inside ``pod``; (0, why) if nothing answers."""
    return await http_get(lab, pod, f"http://127.0.0.1:{PORT}{path}")


async def poll(lab: Lab, pod: Pod, path: str, want: int, timeout: float) -> str:  # noqa: ASYNC109
    last: tuple[int, str] = (0, "")
    began = time.monotonic()
    with trio.move_on_after(timeout):
        while True:
            last = await get(lab, pod, path)
            if last[0] == want:
                print(f"{path}: {want} after {time.monotonic() - began:.2f} s")
                return last[1]
            await trio.sleep(0.2)
    raise AssertionError(f"{path}: no {want} within {timeout} s; last answer {last}")


def samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


async def start(mesh: MeshLab, rank: int) -> LabProcess:
    return await mesh.start_rank(rank, "--http-listen", f"127.0.0.1:{PORT}")


async def test_readiness_flips_at_claim_and_holds_through_an_etcd_outage(lab: Lab) -> None:
    with trio.fail_after(120):
        mesh = MeshLab.create(lab, ttl=3)
        pod = mesh.pod(0)
        await lab.stop_etcd()
        await start(mesh, 0)
        # Up, interface there, but no registry: not claimed, so not ready.
        body = await poll(lab, pod, "/readyz", 503, 30)
        assert "not ready" in body
        await trio.sleep(1.0)
        status, body = await get(lab, pod, "/readyz")
        assert (status, "not claimed" in body or "does not" in body) == (503, True), body
        assert (await get(lab, pod, "/healthz"))[0] == 200

        await lab.start_etcd()
        # Ready at the claim: at most one registry retry (REGISTRY_BACKOFF_MAX) after
        # etcd answers, plus the claim; a readiness that waited for something slower
        # (the 30 s resync, the 60 s watch restart) fails.
        body = await poll(lab, pod, "/readyz", 200, REGISTRY_BACKOFF_MAX + 1.5)
        assert body.startswith("ready: vnet0 holds 10.250.0.1")

        await lab.stop_etcd()
        for _ in range(4):  # past the 3 s lease TTL: the address is still ours
            await trio.sleep(1.0)
            status, body = await get(lab, pod, "/readyz")
            assert status == 200, body
        await lab.start_etcd()


async def test_metrics_follow_a_join_and_a_leave(lab: Lab) -> None:
    with trio.fail_after(120):
        mesh = MeshLab.create(lab)
        pod = mesh.pod(0)
        await start(mesh, 0)
        await start(mesh, 1)
        await poll(lab, pod, "/readyz", 200, 30)

        async def scrape_until(members: float, peers: float) -> dict[str, float]:
            with trio.move_on_after(30):
                while True:
                    status, text = await get(lab, pod, "/metrics")
                    got = samples(text) if status == 200 else {}
                    if (
                        got.get("vnetd_members_registered") == members
                        and got.get("vnetd_peers_configured") == peers
                    ):
                        return got
                    await trio.sleep(0.2)
            raise AssertionError(f"metrics never showed {members} members / {peers} peers")

        before = await scrape_until(2, 1)
        await start(mesh, 2)
        joined = await scrape_until(3, 2)
        await mesh.daemons[2].stop()
        left = await scrape_until(2, 1)

        runs = "vnetd_reconcile_runs_total"
        assert before[runs] < joined[runs] < left[runs]
        plans = "vnetd_plan_changes_count"
        assert before[plans] + 1 <= joined[plans] and joined[plans] + 1 <= left[plans]
        assert joined["vnetd_reconcile_duration_seconds_count"] >= joined[runs] - 1

        status, text = await get(lab, pod, "/status")
        assert status == 200
        document = json.loads(text)
        assert document["self"]["rank"] == 0 and document["self"]["claimed"] is True
        assert document["registered"] == 2
        assert document["missing"] == [2]


def private_key(mesh: MeshLab, rank: int) -> str:
    return (mesh.pod(rank).state_dir / "private.key").read_text().strip()


async def test_json_logs_parse_and_no_secret_leaks_anywhere(lab: Lab) -> None:
    with trio.fail_after(120):
        mesh = MeshLab.create(lab)
        pod = mesh.pod(0)
        argv = [
            sys.executable, "-m", "vnetd", "--log-format", "json", "up",
            "--config", str(mesh.spec_path), "--rank", "0",
            "--state-dir", str(pod.state_dir), "--http-listen", f"127.0.0.1:{PORT}",
        ]  # fmt: skip
        daemon = await lab.start(pod, argv, {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name})
        await start(mesh, 1)
        await poll(lab, pod, "/readyz", 200, 30)
        await lab.run(pod, ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        outputs: dict[str, str] = {}
        for path in ("/metrics", "/status", "/healthz", "/readyz"):
            outputs[path] = (await get(lab, pod, path))[1]
        shown = await lab.run(
            pod,
            [sys.executable, "-m", "vnetd", "status", "--config", str(mesh.spec_path),
             "--wireguard-dir", "/run/wireguard"],
            30,
            beside=daemon,
        )  # fmt: skip
        outputs["vnetd status"] = shown.stdout.decode()
        assert "this device" in outputs["vnetd status"], shown.stderr
        assert await daemon.stop() == 0
        outputs["json log"] = daemon.log_text()

        records: list[dict[str, Any]] = [
            json.loads(line) for line in daemon.log_text().splitlines()
        ]
        assert records, "the daemon logged nothing"
        assert {"time", "level", "logger", "rank", "message"} <= set(records[0])
        assert all(r["rank"] == "0" for r in records[1:])
        messages = [r["message"] for r in records]
        assert any(m.startswith("claimed rank 0") for m in messages)
        assert any(m.startswith("peer joined: rank 1") for m in messages)

        for rank in (0, 1):
            key = private_key(mesh, rank)
            forms = {key, base64.b64decode(key).hex()}
            outputs[f"daemon {rank} log"] = mesh.daemons.get(rank, daemon).log_text()
            for where, text in outputs.items():
                for form in forms:
                    assert form not in text, f"rank {rank}'s private key appears in {where}"


async def test_status_answers_only_inside_the_pod_when_served_on_every_address(
    lab: Lab,
) -> None:
    """Issue 25, item 6: served on ``0.0.0.0`` as the manifests do (the kubelet's probes
    come from the node), ``/status`` (every member's endpoint, key and instance) answers
    403 to another pod and 200 on the pod's own loopback; ``/metrics`` and ``/readyz``
    answer both."""
    with trio.fail_after(90):
        mesh = MeshLab.create(lab)
        await mesh.start_rank(0, "--http-listen", f"0.0.0.0:{PORT}")
        await mesh.start_rank(1)
        outside = f"http://{mesh.pod(0).underlay_ip}:{PORT}"
        await poll(lab, mesh.pod(0), "/readyz", 200, 30)
        status, body = await http_get(lab, mesh.pod(1), f"{outside}/status")
        assert status == 403 and "answers only from inside the pod" in body, (status, body)
        assert (await get(lab, mesh.pod(0), "/status"))[0] == 200
        for path in ("/metrics", "/readyz"):
            assert (await http_get(lab, mesh.pod(1), f"{outside}{path}"))[0] == 200, path
