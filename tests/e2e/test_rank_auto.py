"""``vnetd up --rank auto``: nodes without a pod index get sticky, distinct ranks.

Six "nodes" (pods) start at the same moment against real etcd; each must
end up with its own rank in 0..5, claimed under its node name. After every
daemon is stopped and started again, each node has the same rank. A seventh
node finds the mesh full and exits 2 with one line.
"""

from __future__ import annotations

import json
import sys
import time

import trio
from bounds import FORMATION

from vnetd.control.assign import assign_prefix
from vnetd.lab.cluster import MeshLab, write_spec
from vnetd.lab.open_lab import LabProcess, open_lab
from vnetd.spec import load_spec

NODES = 6
REGISTERED_WITHIN = FORMATION
"""Every node holds a rank within this long of the start: start-up on loaded cores and
the retries of the nodes that lost a race; below the watch's 60 s restart."""


async def test_concurrent_nodes_get_distinct_sticky_ranks() -> None:
    with trio.fail_after(150):
        async with open_lab(NODES + 1) as lab:
            spec_path = write_spec(lab.workdir / "mesh.toml", NODES, lab.etcd_url, name="nodes")
            spec = load_spec(spec_path)
            mesh = MeshLab(lab, spec_path, spec)

            async def start(node: int) -> LabProcess:
                pod = lab.pods[node]
                argv = [
                    sys.executable, "-m", "vnetd", "up", "--config", str(spec_path),
                    "--rank", "auto", "--instance", f"node-{node}",
                    "--state-dir", str(pod.state_dir),
                ]  # fmt: skip
                return await lab.start(pod, argv, {"POD_IP": pod.underlay_ip})

            async def assignments() -> dict[str, int]:
                result = await lab.etcdctl("get", "--prefix", assign_prefix(spec))
                lines = result.stdout.decode().splitlines()
                records = [json.loads(v) for v in lines[1::2]]
                return {r["node"]: r["rank"] for r in records}

            async def start_all_at_once() -> dict[int, LabProcess]:
                daemons: dict[int, LabProcess] = {}

                async def one(node: int) -> None:
                    daemons[node] = await start(node)

                began = time.monotonic()
                async with trio.open_nursery() as nursery:
                    for node in range(NODES):
                        nursery.start_soon(one, node)
                with trio.move_on_after(REGISTERED_WITHIN):
                    while await mesh.registered_ranks() != set(range(NODES)):
                        await trio.sleep(0.2)
                assert await mesh.registered_ranks() == set(range(NODES)), {
                    n: p.log_text()[-400:] for n, p in daemons.items()
                }
                print(f"{NODES} nodes registered {time.monotonic() - began:.2f} s after the start")
                return daemons

            daemons = await start_all_at_once()
            first = await assignments()
            assert sorted(first.values()) == list(range(NODES)), first
            assert set(first) == {f"node-{n}" for n in range(NODES)}
            for node, process in daemons.items():
                rank = first[f"node-{node}"]
                assert f"claimed rank {rank} as node-{node}" in process.log_text()

            for process in daemons.values():
                assert await process.stop() == 0
            daemons = await start_all_at_once()
            assert await assignments() == first, "a restart must keep every node's rank"
            for node, process in daemons.items():
                assert f"node node-{node} keeps rank {first[f'node-{node}']}" in process.log_text()

            extra = await start(NODES)
            assert await extra.wait(30) == 2
            last = extra.log_text().strip().splitlines()[-1]
            assert last.startswith("vnetd: error: --rank auto: mesh 'nodes' is full"), last
