"""A member that joins and leaves again and again does not flood a watcher's log.

A registry writer (or a crash-looping pod) can make a rank join and leave as
often as etcd takes writes; one line per join and per leave would be as many
lines on every daemon. Here a member at rank 2 is registered and deleted 100
times in a row, each write its own watch event; rank 0's log names the first
few of rank 2's joins and leaves, then says it is counting them, and once
rank 2 is steady says how many it did not log. Rank 0's peers are right
afterwards, and rank 0 still reaches rank 1 (docs/security.md, "Junk in the
registry").
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import trio
from bounds import form
from test_faults_process import wait_log

from vnetd.control.membership import member_key
from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab

WRITER = Path(__file__).with_name("flap_writer.py")
CYCLES = 100
GAP = 0.05
"""Seconds between the writer's puts and deletes: each reaches the watch on its own."""
RANK2_LINES_LIMIT = 30
"""Rank 2's lines in rank 0's log; unlimited, the 200 changes make about 600."""


async def test_a_flapping_member_is_logged_a_bounded_number_of_times(lab: Lab) -> None:
    with trio.fail_after(150):
        mesh = MeshLab.create(lab)
        await mesh.start_rank(0)
        await mesh.start_rank(1)
        await mesh.start_probes()
        await form(mesh, {0, 1})
        record = {
            "rank": 2,
            "public_key": base64.b64encode(bytes(range(100, 132))).decode(),
            "endpoint": f"{mesh.pod(2).underlay_ip}:51820",
            "instance": "flapper",
            "started": 1.0,
            "version": "test",
        }
        before = len(mesh.daemons[0].log_text().splitlines())
        argv = ["ip", "netns", "exec", lab.etcd_netns, sys.executable, str(WRITER),
                lab.etcd_url, member_key(mesh.spec, 2), json.dumps(record), str(CYCLES),
                str(GAP)]  # fmt: skip
        with trio.fail_after(90):
            result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
        print(f"flapped: {result.stdout.decode().strip()}")
        await trio.sleep(1)
        flapped = mesh.daemons[0].log_text().splitlines()[before:]
        print(f"rank 0 logged {len(flapped)} lines while rank 2 flapped")
        await wait_log(mesh.daemons[0], "joins and leaves of rank 2 not logged", 30)
        lines = mesh.daemons[0].log_text().splitlines()[before:]
        rank2 = [line for line in lines if re.search(r"\brank 2\b", line)]
        applied = [line for line in lines if "plan applied" in line]
        print(f"then {len(lines)} lines: {len(rank2)} about rank 2, {len(applied)} 'plan applied'")
        assert len(rank2) < RANK2_LINES_LIMIT, rank2[-5:]
        assert len(applied) < RANK2_LINES_LIMIT, applied[-5:]
        (named,) = [line for line in rank2 if "not logged" in line]
        skipped = int(re.search(r"(\d+) joins and leaves of rank 2 not logged", named)[1])
        joined_left = [line for line in rank2 if re.search(r"peer (joined|left): rank 2", line)]
        assert skipped + len(joined_left) >= CYCLES, (skipped, len(joined_left))
        assert await mesh.device_ranks(0) == {1}, "rank 2 left last"
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        assert mesh.dead_daemons() == {}
