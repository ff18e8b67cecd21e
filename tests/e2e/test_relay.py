"""Daemons that read the members through ``vnetd relay`` (docs/architecture.md, "Relay"):
real etcd, real wireguard-go, netns pods; the relays run in a pod of their own.

A mesh forms through a relay while etcd holds one watch on the prefix; relays killed in
the middle of a formation (daemons move to the next relay, then to etcd itself); a relay
behind by a compaction lists again; a relay that forges or cuts a record is refused.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from bounds import form

from vnetd.control.membership import member_key, members_prefix
from vnetd.lab.cluster import MeshLab, http_get, write_spec
from vnetd.lab.netns import signal_pid
from vnetd.lab.open_lab import Lab, LabProcess, Pod, open_lab
from vnetd.spec import load_spec

HERE = Path(__file__).parent
RELAY_READY = 15.0
"""A relay's start-up (a Python process on loaded cores) and its first list."""
CLAIMED = 20.0
"""A daemon's claim after its start, on loaded cores (below FORMATION)."""
REFUSED_WAIT = 3.0
"""How long after the honest daemons hold the rank the others are watched for it:
above the relay's delay (it forwards each batch at once), below a lease TTL."""


def mesh_of(lab: Lab, daemons: int) -> MeshLab:
    """A mesh of ``daemons`` ranks on the first pods; the last pod is the relays'."""
    path = write_spec(lab.workdir / "mesh.toml", daemons, lab.etcd_urls)
    return MeshLab(lab, path, load_spec(path))


def relay_pod(lab: Lab) -> Pod:
    return lab.pods[-1]


def relay_url(lab: Lab, port: int) -> str:
    return f"http://{relay_pod(lab).underlay_ip}:{port}"


async def start_relay(mesh: MeshLab, port: int, argv: list[str] | None = None) -> LabProcess:
    """``vnetd relay`` (or ``argv``) in the relays' pod, returned once it is in step."""
    lab = mesh.lab
    pod = relay_pod(lab)
    argv = argv or [
        sys.executable, "-m", "vnetd", "relay", "--config", str(mesh.spec_path),
        "--listen", f"{pod.underlay_ip}:{port}",
    ]  # fmt: skip
    process = await lab.start(pod, argv, private_mount=False)
    with trio.fail_after(RELAY_READY):
        while (await http_get(lab, pod, f"{relay_url(lab, port)}/healthz"))[0] != 200:
            assert process.returncode is None, process.log_text()
            await trio.sleep(0.2)
    return process


async def wait_claimed(mesh: MeshLab, rank: int) -> None:
    with trio.fail_after(CLAIMED):
        while mesh.claimed_at(rank) is None:
            assert mesh.daemons[rank].returncode is None, mesh.daemons[rank].log_text()[-2000:]
            await trio.sleep(0.1)


async def etcd_watchers(lab: Lab) -> int:
    """etcd's ``etcd_debugging_mvcc_watcher_total``: the watchers it holds now."""
    status, text = await http_get(lab, relay_pod(lab), f"{lab.etcd_url}/metrics")
    assert status == 200, text
    match = re.search(r"^etcd_debugging_mvcc_watcher_total (\S+)$", text, re.MULTILINE)
    assert match, "etcd has no etcd_debugging_mvcc_watcher_total metric"
    return int(float(match.group(1)))


def peers_left(mesh: MeshLab) -> dict[int, list[str]]:
    """Each daemon's 'peer left' lines (none should be, in a mesh that only grows)."""
    found = {r: [line for line in d.log_text().splitlines() if "peer left" in line]
             for r, d in mesh.daemons.items()}  # fmt: skip
    return {r: lines for r, lines in found.items() if lines}


def relisted_after_compaction(log: str) -> bool:
    compacted = log.find("compacted")
    return compacted >= 0 and "relay: listed" in log[compacted:]


async def test_daemons_form_a_mesh_through_a_relay_and_etcd_holds_one_watch() -> None:
    async with open_lab(5) as lab:
        mesh = mesh_of(lab, 4)
        url = relay_url(lab, 2381)
        watchers_before = await etcd_watchers(lab)
        await start_relay(mesh, 2381)
        for rank in range(4):
            await mesh.start_rank(rank, "--relay", url)
        await mesh.start_probes()
        await form(mesh)
        watchers = await etcd_watchers(lab) - watchers_before
        print(f"etcd watchers with 4 daemons through one relay: {watchers}")
        assert watchers == 1, f"etcd holds {watchers} watches for 4 daemons and one relay"
        status, metrics = await http_get(lab, relay_pod(lab), f"{url}/metrics")
        assert status == 200 and "vnetd_relay_watchers 4\n" in metrics, metrics
        assert not mesh.dead_daemons()
        logs = "".join(d.log_text() for d in mesh.daemons.values())
        assert "reading etcd directly" not in logs, "a daemon fell back while the relay ran"


async def test_relays_killed_in_the_middle_of_a_formation() -> None:
    """Relay A dies after three daemons started, relay B after the fourth; the fifth
    starts with neither: every daemon reads on (B, then etcd itself), none exits, no
    peer is dropped, and the mesh forms."""
    async with open_lab(6) as lab:
        mesh = mesh_of(lab, 5)
        first = await start_relay(mesh, 2381)
        second = await start_relay(mesh, 2382)
        relays = ["--relay", relay_url(lab, 2381), "--relay", relay_url(lab, 2382)]
        for rank in range(3):
            await mesh.start_rank(rank, *relays)
        await wait_claimed(mesh, 0)
        first.kill()
        await mesh.start_rank(3, *relays)
        await wait_claimed(mesh, 3)
        second.kill()
        await mesh.start_rank(4, *relays)
        await mesh.start_probes()
        await form(mesh)
        assert not mesh.dead_daemons()
        assert not peers_left(mesh), peers_left(mesh)
        logs = "".join(d.log_text() for d in mesh.daemons.values())
        assert "reading etcd directly" in logs, "no daemon fell back to etcd"


async def test_a_relay_behind_by_a_compaction_lists_again() -> None:
    """The relay is stopped and its connections to etcd cut (``ss -K``) while rank 3
    joins and etcd compacts past that join: woken, the relay resumes its watch from a
    compacted revision, lists again and serves rank 3; no daemon misses rank 3 (those
    on the stopped relay fall back to etcd meanwhile), none exits."""
    async with open_lab(5) as lab:
        mesh = mesh_of(lab, 4)
        url = relay_url(lab, 2381)
        relay = await start_relay(mesh, 2381)
        for rank in range(3):
            await mesh.start_rank(rank, "--relay", url)
        await mesh.start_probes()
        await form(mesh, {0, 1, 2})
        signal_pid(relay.pid, signal.SIGSTOP)
        try:
            etcd_ip = lab.etcd_url.split("//")[1].split(":")[0]
            cut = await lab.run(relay_pod(lab), ["ss", "-K", "dst", etcd_ip])
            assert cut.returncode == 0, cut.stderr
            await mesh.start_rank(3, "--relay", url)
            await wait_claimed(mesh, 3)
            await lab.etcdctl("put", "/relay-test/after-rank-3", "x")  # past rank 3's revision
            await lab.compact_etcd()
        finally:
            signal_pid(relay.pid, signal.SIGCONT)
        with trio.move_on_after(RELAY_READY):
            while not relisted_after_compaction(relay.log_text()):
                await trio.sleep(0.2)
        assert relisted_after_compaction(relay.log_text()), relay.log_text()[-3000:]
        await form(mesh, since=time.monotonic())
        status, body = await http_get(lab, relay_pod(lab), f"{url}/healthz")
        assert status == 200, body
        key = member_key(mesh.spec, 3)
        listed = await lab.run(relay_pod(lab), [
            sys.executable, "-c",
            "import base64,json,sys,urllib.request as u;"
            "b=json.dumps({'key':base64.b64encode(sys.argv[2].encode()).decode()}).encode();"
            "print(json.load(u.urlopen(u.Request(sys.argv[1],data=b),timeout=3)).get('count'))",
            f"{url}/v3/kv/range", key,
        ])  # fmt: skip
        assert listed.stdout.decode().strip() == "1", listed
        assert not mesh.dead_daemons()


@pytest.mark.parametrize("mode", ["forged", "truncated"])
async def test_a_relay_that_changes_a_record_is_refused(mode: str) -> None:
    """Daemons 0 and 1 read through a relay that serves rank 2's record changed; rank 2
    reads etcd. 0 and 1 keep each other and never take rank 2's record."""
    async with open_lab(4) as lab:
        mesh = mesh_of(lab, 3)
        pod = relay_pod(lab)
        argv = [
            sys.executable, str(HERE / "forging_relay.py"), lab.etcd_url,
            members_prefix(mesh.spec), f"{pod.underlay_ip}:2381", member_key(mesh.spec, 2), mode,
        ]  # fmt: skip
        await start_relay(mesh, 2381, argv)
        url = relay_url(lab, 2381)
        for rank in (0, 1):
            await mesh.start_rank(rank, "--relay", url)
        await mesh.start_rank(2)
        await mesh.start_probes()
        await form(mesh, {0, 1})
        await wait_claimed(mesh, 2)
        with trio.fail_after(CLAIMED):
            while not {0, 1} <= await mesh.device_ranks(2):
                await trio.sleep(0.2)
        await trio.sleep(REFUSED_WAIT)
        for rank in (0, 1):
            assert 2 not in await mesh.device_ranks(rank), mesh.daemons[rank].log_text()[-2000:]
            log = mesh.daemons[rank].log_text()
            assert "skipping bad registry entry" in log, log[-2000:]
        assert not mesh.dead_daemons()
