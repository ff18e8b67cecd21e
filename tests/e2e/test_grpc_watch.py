"""Daemons that watch the members over etcd's native gRPC (``[registry] watch = "grpc"``):
a mesh forms watching etcd directly, and watching through ``etcd grpc-proxy start`` run
in the lab's etcd namespace. (The proxy coalesces only watchers at one revision; a
daemon watches from its list's revision, before its own claim, so here each member
watch stays one on etcd: the test prints etcd's watcher count, and asserts none.)
(A compaction under the gRPC watch: ``test_faults_registry.py``, scenario 10.)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from bounds import form

from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.etcd import ETCD_BIN
from vnetd.lab.open_lab import ETCD_IP, Lab, open_lab
from vnetd.spec import load_spec

RANKS = 3
PROXY_PORT = 23790
PROXY_READY = 15.0
"""The proxy answers its /metrics within this long (it starts in well under a second)."""


@asynccontextmanager
async def grpc_proxy(lab: Lab, data_dir: Path) -> AsyncIterator[str]:
    """``etcd grpc-proxy start`` in the lab's etcd namespace, in front of the lab's etcd;
    its URL. Stopped by its pid on exit."""
    listen = f"{ETCD_IP}:{PROXY_PORT}"
    argv = ["ip", "netns", "exec", lab.etcd_netns, ETCD_BIN, "grpc-proxy", "start",
            "--endpoints", lab.etcd_url.removeprefix("http://"), "--listen-addr", listen,
            "--data-dir", str(data_dir)]  # fmt: skip
    log = (data_dir.parent / "grpc-proxy.log").open("ab")
    process = await trio.lowlevel.open_process(argv, stdout=log, stderr=log)
    try:
        url = f"http://{listen}"
        with trio.fail_after(PROXY_READY):
            while (await http_get(lab, lab.pods[0], f"{url}/metrics"))[0] != 200:
                assert process.returncode is None, "grpc-proxy exited"
                await trio.sleep(0.2)
        yield url
    finally:
        process.kill()
        with trio.move_on_after(5):
            await process.wait()
        log.close()


async def proxy_clients(lab: Lab) -> set[str]:
    """The addresses with an established connection to the proxy's port."""
    argv = ["ip", "netns", "exec", lab.etcd_netns, "ss", "-Htn", "state", "established",
            f"( sport = :{PROXY_PORT} )"]  # fmt: skip
    with trio.fail_after(10):
        result = await trio.run_process(argv, capture_stdout=True)
    peers = (line.split()[-1] for line in result.stdout.decode().splitlines() if line.strip())
    return {peer.rsplit(":", 1)[0] for peer in peers}


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in the metrics"
    return float(found.group(1))


async def test_a_mesh_whose_daemons_watch_over_grpc_forms() -> None:
    with trio.fail_after(90):
        async with open_lab(RANKS) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            for rank in range(RANKS):
                await mesh.start_rank(rank, "--etcd-watch", "grpc")
            formation = await form(mesh)
            print(f"gRPC watch: {formation}")
            assert not mesh.dead_daemons()


async def test_a_mesh_forms_watching_through_etcds_grpc_proxy(
    tmp_path: Path,
) -> None:
    with trio.fail_after(120):
        async with open_lab(RANKS) as lab:
            async with grpc_proxy(lab, tmp_path / "proxy") as proxy:
                mesh = MeshLab.create(lab)
                with mesh.spec_path.open("a") as spec:
                    spec.write(f'watch = "grpc"\nwatch_endpoints = ["{proxy}"]\n')
                mesh.spec = load_spec(mesh.spec_path)
                await mesh.start_probes()
                for rank in range(RANKS):
                    await mesh.start_rank(rank)
                formation = await form(mesh)
                print(f"gRPC watch through grpc-proxy: {formation}")
                assert not mesh.dead_daemons()
                status, text = await http_get(lab, lab.pods[0], f"{proxy}/metrics")
                assert status == 200, text
                coalesced = metric(text, "etcd_grpc_proxy_events_coalescing_total")
                watchers = metric(text, "etcd_debugging_mvcc_watcher_total")  # etcd's, relayed
                print(f"grpc-proxy: etcd holds {watchers:g} watchers for {RANKS} daemons; "
                      f"{coalesced:g} events coalesced")  # fmt: skip
                clients = await proxy_clients(lab)
                pods = {pod.underlay_ip for pod in lab.pods}
                assert pods <= clients, f"daemons not on the proxy: {pods - clients}"
                for daemon in mesh.daemons.values():
                    assert "resumed on" not in daemon.log_text()
