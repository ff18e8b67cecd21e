"""Big junk under the members prefix costs a daemon bounded memory (docs/architecture.md,
"Bounded reads"), with the daemon under a 256 MiB memory limit, as the manifests set.

60 values of 1.4 MiB and 200 keys with 1 MiB names are written under rank 0's members
prefix, and etcd is restarted twice, so the daemon lists the prefix again each time
(its watch breaks; a list reads every value, where a watch event is one). Before
reads were bounded a list held every value whole, several times over (base64, JSON,
bytes): 20 MiB of values cost about 80 MiB. The daemon must survive (no OOM kill in
its cgroup), grow by less than 50 MiB, count every junk entry and name the first
(the log names at most 20 a minute; a long key's cut form is the contract suite's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from bounds import form
from memlimit import memory_limit, why_unavailable
from test_junk_flood import PORT, bad_entries_counted, daemon_pid, rss_kb

from vnetd.control.membership import members_prefix
from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.open_lab import open_lab

MEMORY_LIMIT = 256 * 1024 * 1024
RSS_GROWTH_LIMIT_KB = 50 * 1024
VALUES, VALUE_BYTES = 60, 1400 * 1024
NAMES, NAME_BYTES = 200, 1024 * 1024
RELISTS = 2
RELIST_WAIT = 240.0
"""From etcd's restart until the daemon has listed again. The list reads ~280 MiB
through etcd's JSON gateway in ~260 pages: 15-20 s here with both daemons listing on
a quiet machine, over 80 s on a loaded one (the gateway's base64 and JSON pass is the
cost). Not a speed bound: this test guards memory; the wait only makes sure the lists
happened."""
WRITE_WAIT = 480.0
"""For the writer's 260 puts (~284 MiB). etcd's JSON gateway encodes each value for the
put and again for each of the two daemons' watches: 0.6 s a put was seen at load
50-90 (about 156 s in all, over the 120 s this wait was). Not a speed bound either."""
WRITER = Path(__file__).with_name("junk_big_writer.py")


async def watch_restarts(mesh: MeshLab) -> int | None:
    """The daemon's ``vnetd_watch_restarts_total``; None when the scrape (a fresh Python
    in the pod) did not finish within ``http_get``'s bound, as on a loaded machine."""
    try:
        status, body = await http_get(mesh.lab, mesh.pod(0), f"http://127.0.0.1:{PORT}/metrics")
    except trio.TooSlowError:
        return None
    assert status == 200, body
    for line in body.splitlines():
        if line.startswith("vnetd_watch_restarts_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no vnetd_watch_restarts_total in /metrics")


async def restarts_now(mesh: MeshLab) -> int:
    while (found := await watch_restarts(mesh)) is None:
        await trio.sleep(0.5)
    return found


@pytest.mark.timeout(1500)  # the writer and two lists of ~280 MiB each: minutes when loaded
async def test_big_junk_values_and_names_leave_a_memory_limited_daemon_alive_and_small() -> None:
    unavailable = why_unavailable()
    if unavailable:
        pytest.skip(f"cannot limit a process's memory here: {unavailable}")
    with trio.fail_after(WRITE_WAIT + RELISTS * RELIST_WAIT + 300):
        async with open_lab(2) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            await mesh.start_rank(0, "--http-listen", f"127.0.0.1:{PORT}")
            await mesh.start_rank(1)
            await form(mesh)
            pid = daemon_pid(mesh, 0)
            with memory_limit(pid, MEMORY_LIMIT) as cgroup:
                await trio.sleep(1)
                before_rss = rss_kb(pid)
                argv = ["ip", "netns", "exec", lab.etcd_netns, sys.executable, str(WRITER),
                        lab.etcd_url, members_prefix(mesh.spec), str(VALUES), str(VALUE_BYTES),
                        str(NAMES), str(NAME_BYTES)]  # fmt: skip
                with trio.fail_after(WRITE_WAIT):
                    written = await trio.run_process(argv, capture_stdout=True)
                print(f"junk written: {written.stdout.decode().strip()}")
                for relist in range(RELISTS):
                    restarts = await restarts_now(mesh)
                    await lab.stop_etcd()
                    await lab.start_etcd()
                    started = trio.current_time()
                    with trio.move_on_after(RELIST_WAIT):
                        while await restarts_now(mesh) <= restarts:
                            await trio.sleep(0.5)
                    took = trio.current_time() - started
                    print(f"list {relist + 1}: watching again {took:.1f} s after etcd started "
                          f"(load {os.getloadavg()[0]:.1f})")  # fmt: skip
                    tail = mesh.daemons[0].log_text()[-3000:]
                    assert await restarts_now(mesh) > restarts, f"no list again: {tail}"
                counted = await bad_entries_counted(mesh, 0)
                after_rss = rss_kb(pid)
                oom_kills, peak = cgroup.oom_kills(), cgroup.peak_bytes()
            growth = after_rss - before_rss
            print(f"daemon RSS {before_rss} kB -> {after_rss} kB (+{growth} kB); cgroup peak "
                  f"{(peak or 0) // 1024} kB; OOM kills {oom_kills}; bad entries {counted}")  # fmt: skip
            assert oom_kills == 0 and not mesh.dead_daemons()
            assert growth < RSS_GROWTH_LIMIT_KB
            assert counted == VALUES + NAMES
            log = mesh.daemons[0].log_text()
            assert f"skipping bad registry entry: {members_prefix(mesh.spec)}big-value-0: " in log
            assert await mesh.device_ranks(0) == {1}
