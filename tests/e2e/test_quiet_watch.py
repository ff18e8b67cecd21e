"""A daemon whose host stalls past its watch's quiet check costs etcd no read when it
resumes, while its member is healthy (vnetd/registry/etcd/watch.py: a check whose timer
fired late first waits for what came meanwhile).

Before the fix such a stall cost one linearizable read (this test's figure: 1). The
doctor bench once counted more etcd ranges during a run than its own list (17 at 32
ranks under load 24, 66 at 64 under load 40; 2 is the list), which such checks would
explain; at 32 ranks under load 10-32 it counted 2, before the fix and after it.
"""

from __future__ import annotations

import signal

import trio
from bounds import form
from prometheus_client.parser import text_string_to_metric_families

from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.netns import signal_pid
from vnetd.lab.open_lab import open_lab

TTL = 10
"""Keepalive every TTL/3 (3.3 s): a stop of ``STOPPED`` keeps the lease (it ends at
the earliest 6.7 s after the last renewal)."""
STOPPED = 4.5
"""Longer than the quiet check (3 s, 1.5 gaps of the lab's 2 s notifications) and its
lateness bound (0.25 s), shorter than the lease's earliest end."""
LEARNT = 5.0
"""After the formation: two notifications have come, so the gap is known."""
SETTLE = 2.0
"""After the stop: the resumed daemon's late timer has fired and been answered."""


async def ranges(mesh: MeshLab) -> float:
    """The Range requests etcd has received (its /metrics, read from pod 1)."""
    status, body = await http_get(mesh.lab, mesh.pod(1), f"{mesh.lab.etcd_url}/metrics")
    assert status == 200, body
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "grpc_server_msg_received_total"
        and sample.labels.get("grpc_method") == "Range"
    )


async def test_a_daemon_stalled_past_its_quiet_check_costs_etcd_no_read() -> None:
    with trio.fail_after(60):
        async with open_lab(2) as lab:
            mesh = MeshLab.create(lab, ttl=TTL)
            await mesh.start_probes()
            for rank in (0, 1):
                await mesh.start_rank(rank)
            await form(mesh)
            await trio.sleep(LEARNT)
            before = await ranges(mesh)
            daemon = mesh.daemons[0]
            signal_pid(daemon.pid, signal.SIGSTOP)
            try:
                await trio.sleep(STOPPED)
            finally:
                signal_pid(daemon.pid, signal.SIGCONT)
            await trio.sleep(SETTLE)
            after = await ranges(mesh)
            print(f"etcd ranges over the stop and {SETTLE:g} s after: {after - before:g}")
            assert after - before == 0
            assert not mesh.dead_daemons()
            assert await mesh.registered_ranks() == {0, 1}
