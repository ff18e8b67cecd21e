"""A daemon's paged list that stops mid-way resumes at its page, and starts over when
etcd compacted its revision meanwhile, against real etcd and wireguard-go.

Rank 0 reaches etcd through ``stall_proxy.py`` in its own pod, which can hold a
list's pages after the first (those that carry the list's revision) unanswered and
cut its watch. With three members a list of ``members/`` is two pages (the first is
``FIRST_PAGE_KEYS`` = 2 keys). The stall cuts rank 0's watch, so it lists again; its
second page gets no answer three times, the list stops, and the next list resumes at
that page (logged). Rank 2 then leaves and etcd is compacted past the stopped list's
revision; once the pages are answered again the resumed page finds its revision
compacted, the list starts over from its first page (logged), and rank 0 drops rank 2
and keeps rank 1 (docs/architecture.md, "Bounded reads"; the unit and contract twins
are ``tests/unit/test_etcd_pages.py`` and ``tests/contract/test_registry.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
from bounds import form
from test_faults_process import wait_log

from vnetd.control.membership import members_prefix
from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, LabProcess

PROXY = Path(__file__).with_name("stall_proxy.py")
PROXY_PORT = 23790
STOPPED_WITHIN = 90.0
"""From the stall to the resumed list: three attempts at the held page (each the
call's bound plus 5 s, then 10 s more after each miss) and the retry's backoff."""


async def seen(process: LabProcess, needle: str, timeout: float, control: Path) -> None:  # noqa: ASYNC109
    """``wait_log``, failing with the daemon's last lines and what the proxy held."""
    try:
        await wait_log(process, needle, timeout)
    except trio.TooSlowError:
        held = control / "held"
        raise AssertionError(
            f"no {needle!r} within {timeout} s; held pages at revisions "
            f"{held.read_text().split() if held.exists() else []}; log:\n"
            f"{process.log_text()[-3000:]}"
        ) from None


async def test_a_stopped_list_resumes_and_starts_over_after_a_compaction(lab: Lab) -> None:
    with trio.fail_after(240):
        mesh = MeshLab.create(lab)
        control = lab.workdir / "proxy"
        control.mkdir()
        proxy = await lab.start(mesh.pod(0), [
            sys.executable, str(PROXY), str(PROXY_PORT), lab.etcd_urls[0], str(control),
            members_prefix(mesh.spec),
        ])  # fmt: skip
        await wait_log(proxy, "listening", 20)
        rank0 = await mesh.start_rank(0, "--etcd", f"http://127.0.0.1:{PROXY_PORT}")
        for rank in (1, 2):
            await mesh.start_rank(rank)
        await mesh.start_probes()
        await form(mesh)

        (control / "stall").touch()
        await seen(rank0, f"etcd list {members_prefix(mesh.spec)}: resuming after page 1",
                   STOPPED_WITHIN, control)  # fmt: skip
        assert await mesh.device_ranks(0) == {1, 2}  # static stability meanwhile
        await mesh.daemons[2].stop()
        listed = json.loads((await lab.etcdctl("get", "/", "--prefix", "--keys-only",
                                               "-w", "json")).stdout)  # fmt: skip
        await lab.etcdctl("compact", str(listed["header"]["revision"]))
        (control / "stall").unlink()
        await seen(rank0, "was compacted after page 1; starting over from the first page", 60,
                   control)  # fmt: skip
        with trio.fail_after(20):
            while await mesh.device_ranks(0) != {1}:
                await trio.sleep(0.2)
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        held = (control / "held").read_text().split()
        assert len(held) >= 3, held  # the first list's three attempts at its second page
        assert rank0.returncode is None and mesh.daemons[1].returncode is None
