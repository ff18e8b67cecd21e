"""The spec key overwritten under running daemons: they run on and say so.

A writer of the mesh's prefix (the mesh user) can overwrite ``<prefix>/<mesh>/spec``;
a daemon started then exits 2 naming the keys that differ (it cannot tell a
changed local spec from a changed stored one). The running daemons keep the
spec they checked at start, keep their peers, and report the change within
``SPEC_CHECK_TTLS`` lease TTLs: a log line, ``vnetd_spec_differs`` 1 and
``/status`` ``self.spec_differs``. Put back, the stored spec is reported as
matching again and a new daemon starts (docs/security.md, "Threat model").
"""

from __future__ import annotations

import json

import trio
from bounds import form
from test_faults_process import wait_log

from vnetd.control.membership import spec_key
from vnetd.control.spec_check import SPEC_CHECK_TTLS
from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.open_lab import Lab

PORT = 9090
TTL = 5
REPORTED_WITHIN = (SPEC_CHECK_TTLS + 2) * TTL
"""The check runs every SPEC_CHECK_TTLS TTLs (its own task); two TTLs of room."""


async def test_an_overwritten_spec_is_reported_and_the_mesh_runs_on(lab: Lab) -> None:
    with trio.fail_after(180):
        mesh = MeshLab.create(lab, ttl=TTL)
        for rank in (0, 1):
            await mesh.start_rank(rank, "--http-listen", f"127.0.0.1:{PORT}")
        await mesh.start_probes()
        await form(mesh, {0, 1})
        key = spec_key(mesh.spec)
        original = (await lab.etcdctl("get", "--print-value-only", key)).stdout.strip()
        changed = json.loads(original)
        changed["size"] = int(changed["size"]) + 5
        before = await mesh.device_dump(0)

        await lab.etcdctl("put", key, json.dumps(changed, separators=(",", ":")))
        for rank in (0, 1):
            await wait_log(mesh.daemons[rank], "keeps running with the spec it checked at start",
                           REPORTED_WITHIN)  # fmt: skip
        status, metrics = await http_get(lab, mesh.pod(0), f"http://127.0.0.1:{PORT}/metrics")
        assert status == 200 and "vnetd_spec_differs 1.0" in metrics, metrics[-500:]
        status, body = await http_get(lab, mesh.pod(0), f"http://127.0.0.1:{PORT}/status")
        differs = json.loads(body)["self"]["spec_differs"]
        assert status == 200 and "mesh.size" in differs, differs
        late = await mesh.start_rank(2)  # replaced in the mesh's daemons by the next start
        assert await late.wait(30) == 2, late.log_text()
        assert "mesh.size: registry has" in late.log_text(), late.log_text()
        after = await mesh.device_dump(0)
        assert [row[:4] for row in after] == [row[:4] for row in before], "peers unchanged"
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()

        await lab.etcdctl("put", key, original.decode())
        await wait_log(mesh.daemons[0], "matches ours again", REPORTED_WITHIN)
        status, metrics = await http_get(lab, mesh.pod(0), f"http://127.0.0.1:{PORT}/metrics")
        assert "vnetd_spec_differs 0.0" in metrics, metrics[-500:]
        await mesh.start_rank(2)
        await wait_log(mesh.daemons[2], "claimed rank 2 ", 60)
        assert mesh.dead_daemons() == {}
