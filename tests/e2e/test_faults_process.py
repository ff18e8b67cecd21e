"""Faults of the daemon's own processes: a SIGKILLed daemon, a dead wireguard-go, and an
interface that belongs to something else. Real etcd, real wireguard-go, netns pods.

A pod's ``/run/wireguard`` is where wireguard-go keeps its UAPI socket. Where a
test restarts a daemon "in the same pod", the pod has a sandbox process (the
pod's pause container) that holds a private mount namespace with its own tmpfs
there, and the daemons run beside it: the directory outlives one daemon, as an
``emptyDir`` volume mounted on ``/run/wireguard`` outlives a container restart.

Gaps in traffic come from the probes' ``lost``/``recovered`` events, with
``--lost-after 0.3`` (three missed 100 ms rounds): a pair that never reports
``lost`` lost less than 0.3 s, provided its probe saw replies after the fault
(the probes report their counters every 0.5 s; a pair without replies is
not measured, and fails). Bounds and their failure modes: ``bounds.py``,
``tests/README.md``.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

import trio
from bounds import AFTER_CLAIM, WG_GO_BACKOFF, form

from vnetd.control.membership import member_key
from vnetd.lab.cluster import MeshLab, log_lines
from vnetd.lab.open_lab import Lab, LabProcess, open_lab
from vnetd.lab.probe import parse_events

LOST_AFTER = 0.3
REPORT_EVERY = 0.5
ADOPTED_GAP = 0.0
"""An adopted wireguard-go serves on while no daemon runs: no pair is silent for
LOST_AFTER ("no other rank notices anything"); a lost session would cost WG_RETRY."""
RESUMED_AFTER_CLAIM = AFTER_CLAIM
"""A fresh restart: each pair flows again within this long of the restarted daemon's
claim (its start-up before the claim is load, not the failure); below WG_RETRY."""
REAPPLIED_WITHIN = WG_GO_BACKOFF
"""wireguard-go killed: the daemon's log has every peer re-applied within this long of
the kill. Its first restart is at once; one that waited for the backoff takes longer."""
WG_RESTART_GAP = 2.0
"""wireguard-go killed: no pair silent longer than this; below WG_RETRY."""
WG_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1", "LOG_LEVEL": "error"}
PLAN_LINE = re.compile(
    r"peer joined: rank (\d+)|peer left: rank (\d+)|peer rank (\d+) (?:endpoint|allowed)"
)


# --- helpers ------------------------------------------------------------------------------


async def start_probes(mesh: MeshLab) -> None:
    """The cluster's probes, reporting a loss after 0.3 s of silence and their counters."""
    await mesh.start_probes(300, report_every=REPORT_EVERY, lost_after=LOST_AFTER)


async def start_sandbox(lab: Lab, rank: int) -> LabProcess:
    """A pause process holding the pod's mount namespace and its /run/wireguard tmpfs.

    Returned once it runs ``sleep``: the wrapper mounts the tmpfs before that
    exec, and a process joining it earlier would see the machine's directory.
    """
    sandbox = await lab.start(lab.pods[rank], ["sleep", "300"])
    with trio.fail_after(10):
        while comm(sandbox.pid) != "sleep":
            assert sandbox.returncode is None, sandbox.log_text()
            await trio.sleep(0.01)
    return sandbox


async def start_beside(mesh: MeshLab, rank: int, sandbox: LabProcess) -> LabProcess:
    """``vnetd up`` for ``rank``, as ``MeshLab.start_rank`` does, but in the sandbox."""
    pod = mesh.pod(rank)
    argv = [
        sys.executable, "-m", "vnetd", "up",
        "--config", str(mesh.spec_path), "--rank", str(rank),
        "--state-dir", str(pod.state_dir),
    ]  # fmt: skip
    env = {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name}
    mesh.started_at[rank] = time.monotonic()
    process = await mesh.lab.start(pod, argv, env, beside=sandbox)
    mesh.daemons[rank] = process
    return process


async def wg(mesh: MeshLab, beside: LabProcess, *args: str) -> str | None:
    """``wg ARGS`` in ``beside``'s namespaces; None when it fails (no device)."""
    result = await mesh.lab.run(beside.pod, ["wg", *args], timeout=10, beside=beside)
    return result.stdout.decode() if result.returncode == 0 else None


async def device_peers(mesh: MeshLab, beside: LabProcess) -> dict[str, tuple[str, str]] | None:
    """``{public key: (endpoint, allowed ips)}`` from ``wg show vnet0 dump``; None if no device."""
    out = await wg(mesh, beside, "show", "vnet0", "dump")
    if out is None:
        return None
    return {f[0]: (f[2], f[3]) for f in (line.split("\t") for line in out.splitlines()[1:])}


async def sessions(mesh: MeshLab, beside: LabProcess) -> dict[str, tuple[int, int, int]]:
    """``{public key: (latest handshake, rx bytes, tx bytes)}`` of the device's peers."""
    out = await wg(mesh, beside, "show", "vnet0", "dump")
    assert out is not None
    rows = (line.split("\t") for line in out.splitlines()[1:])
    return {f[0]: (int(f[4]), int(f[5]), int(f[6])) for f in rows}


def peer_of(peers: dict[str, tuple[str, str]], mesh: MeshLab, rank: int) -> tuple[str, str, str]:
    """(public key, endpoint, allowed ips) of the peer that holds ``rank``'s address."""
    want = f"{mesh.address(rank)}/32"
    (found,) = [(k, e, a) for k, (e, a) in peers.items() if a == want]
    return found


async def registry_entry(mesh: MeshLab, rank: int) -> dict[str, object]:
    """``members/<rank>`` as stored in etcd (etcdctl runs in pod 0)."""
    ctl = ["etcdctl", "--endpoints", mesh.lab.etcd_url, "--dial-timeout=2s",
           "--command-timeout=2s", "get", "--print-value-only", member_key(mesh.spec, rank)]  # fmt: skip
    result = await mesh.lab.run(mesh.pod(0), ctl, timeout=10)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def children(pid: int) -> list[int]:
    result = await trio.run_process(["pgrep", "-P", str(pid)], capture_stdout=True, check=False)
    return [int(p) for p in result.stdout.split()]


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wireguard_go_of(daemon: LabProcess) -> int:
    with trio.fail_after(5):
        while True:
            pids = [p for p in await children(daemon.pid) if comm(p) == "wireguard-go"]
            if pids:
                return pids[0]
            await trio.sleep(0.05)


@dataclass(frozen=True)
class Outage:
    """One ordered pair's silence after a fault."""

    gap: float | None
    """Seconds without replies beyond ``LOST_AFTER`` (0.0: none); None when the pair was
    lost and has not recovered, or its probe saw no reply after the fault."""
    resumed: float | None
    """When replies came back (monotonic), if the pair was lost."""
    replies: int
    """Replies the probe saw after the fault."""

    def __str__(self) -> str:
        gap = "-" if self.gap is None else f"{self.gap:.2f}"
        return f"{gap} ({self.replies} replies)"


def outages(mesh: MeshLab, rank: int, since: float) -> dict[tuple[int, int], Outage]:
    """For each ordered pair with ``rank``, its outage after ``since`` (monotonic)."""
    rank_of = {mesh.address(r): r for r in range(mesh.spec.size)}
    replies = mesh.probe_received(since, math.inf)
    found: dict[tuple[int, int], Outage] = {}
    for src, probe in mesh.probes.items():
        lost: dict[int, float] = {}
        gaps: dict[int, float | None] = {}
        resumed: dict[int, float] = {}
        for event in parse_events(probe.log_text()):
            dst = rank_of.get(event.get("target", ""))
            if dst is None or rank not in (src, dst) or event["t"] < since:
                continue
            if event["event"] == "lost":
                lost[dst] = event["t"] - LOST_AFTER
                gaps[dst] = None
            elif event["event"] == "recovered" and dst in lost:
                gaps[dst] = max(0.0, event["t"] - lost.pop(dst))
                resumed[dst] = event["t"]
        for dst in range(mesh.spec.size):
            if dst != src and rank in (src, dst):
                seen = replies.get((src, dst), 0)
                gap = gaps.get(dst, 0.0) if seen > 0 else None
                found[(src, dst)] = Outage(gap, resumed.get(dst), seen)
    return found


async def measure_outages(
    mesh: MeshLab, rank: int, since: float, timeout: float
) -> dict[tuple[int, int], Outage]:
    """The outages of the pairs with ``rank`` since ``since``, once they are over.

    Call it once the fault has been handled: a pair still silent then reports
    ``lost`` within ``LOST_AFTER``, so after that wait every outage is seen;
    then wait (at most ``timeout`` s) until each has recovered and shown
    replies, and a second more in case of a late flap.
    """
    await trio.sleep(LOST_AFTER + 0.5)
    deadline = trio.current_time() + timeout
    while not all(o.gap is not None for o in outages(mesh, rank, since).values()):
        if trio.current_time() > deadline:
            break
        await trio.sleep(0.1)
    await trio.sleep(1.0)
    return outages(mesh, rank, since)


def plan_lines_about(text: str, rank: int) -> list[str]:
    """Log lines of a plan that touched ``rank``'s peer."""
    hits = []
    for line in text.splitlines():
        match = PLAN_LINE.search(line)
        if match and str(rank) in match.groups():
            hits.append(line)
    return hits


async def wait_log(process: LabProcess, needle: str, timeout: float) -> float:
    """Wait for ``needle`` in the process's log; returns when it was seen."""
    with trio.fail_after(timeout):
        while needle not in process.log_text():
            assert process.returncode is None, process.log_text()
            await trio.sleep(0.05)
    return time.monotonic()


def fmt(gaps: dict[tuple[int, int], Outage]) -> str:
    return ", ".join(f"{a}->{b} {o}" for (a, b), o in sorted(gaps.items()))


def assert_measured(gaps: dict[tuple[int, int], Outage]) -> None:
    """Every pair's probe saw replies after the fault and the pair recovered."""
    unmeasured = {pair: str(o) for pair, o in gaps.items() if o.gap is None}
    assert not unmeasured, f"lost, or no replies seen after the fault: {unmeasured}"


# --- scenario 3: the daemon is SIGKILLed and restarted in the same pod --------------------


async def test_sigkilled_daemon_restarts_and_adopts_its_wireguard_go() -> None:
    k = 1
    with trio.fail_after(90):
        async with open_lab(3) as lab:
            # TTL 10 s (the default): a restart within the TTL keeps the entry alive.
            mesh = MeshLab.create(lab, ttl=10)
            sandbox = await start_sandbox(lab, k)
            for rank in range(3):
                if rank == k:
                    await start_beside(mesh, rank, sandbox)
                else:
                    await mesh.start_rank(rank)
            await start_probes(mesh)
            await form(mesh)
            others = [r for r in range(3) if r != k]

            before = {
                j: peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k) for j in others
            }
            entry = await registry_entry(mesh, k)
            own_key = (await wg(mesh, mesh.daemons[k], "show", "vnet0", "public-key") or "").strip()
            assert own_key == entry["public_key"] == before[others[0]][0]
            logs_before = {j: len(mesh.daemons[j].log_text()) for j in others}
            own_before = await device_peers(mesh, mesh.daemons[k])
            sessions_before = await sessions(mesh, mesh.daemons[k])
            wg_pid = await wireguard_go_of(mesh.daemons[k])

            killed = time.monotonic()
            mesh.daemons[k].kill()
            assert await mesh.daemons[k].wait(5) == -signal.SIGKILL
            assert alive(wg_pid), "wireguard-go is expected to outlive its daemon"

            restarted = await start_beside(mesh, k, sandbox)
            adopted_at = await wait_log(restarted, f"adopted running wireguard-go pid {wg_pid}", 20)
            claimed_at = await wait_log(restarted, "took over its own entry", 20)
            gaps = await measure_outages(mesh, k, killed, timeout=10)
            print(
                f"restart: adopted {adopted_at - killed:.2f} s, claimed {claimed_at - killed:.2f} s "
                f"after the kill; outages (s): {fmt(gaps)}"
            )
            assert_measured(gaps)
            assert all(o.gap is not None and o.gap <= ADOPTED_GAP for o in gaps.values()), fmt(gaps)
            # The same wireguard-go serves on; the new daemon started none of its own,
            # and changed no peer on it: same peers, same sessions, counters still growing.
            assert alive(wg_pid)
            assert [p for p in await children(restarted.pid) if comm(p) == "wireguard-go"] == []
            assert "plan applied" not in restarted.log_text(), restarted.log_text()
            assert await device_peers(mesh, restarted) == own_before
            sessions_after = await sessions(mesh, restarted)
            for peer, (handshake, rx, tx) in sessions_before.items():
                assert sessions_after[peer][0] == handshake, "a re-added peer loses its session"
                assert sessions_after[peer][1] >= rx and sessions_after[peer][2] >= tx

            # No flap: nobody re-wrote its peer for rank k, which kept its key and endpoint.
            for j in others:
                text = mesh.daemons[j].log_text()[logs_before[j] :]
                assert plan_lines_about(text, k) == [], text
                after = peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k)
                assert after == before[j], (j, after, before[j])
            entry_after = await registry_entry(mesh, k)
            assert (entry_after["public_key"], entry_after["endpoint"]) == (
                entry["public_key"],
                entry["endpoint"],
            )
            addr = await lab.run(mesh.pod(k), ["ip", "-o", "-4", "addr", "show", "dev", "vnet0"])
            assert f"inet {mesh.address(k)}/16" in addr.stdout.decode()
            assert mesh.dead_daemons() == {}


async def test_sigkilled_daemon_whose_wireguard_go_died_too_restarts_fresh() -> None:
    """The default Kubernetes container: its processes die together, nothing is adopted."""
    k = 2
    with trio.fail_after(90):
        async with open_lab(3) as lab:
            mesh = MeshLab.create(lab, ttl=10)
            for rank in range(3):
                await mesh.start_rank(rank)
            await start_probes(mesh)
            await form(mesh)
            others = [r for r in range(3) if r != k]
            before = {
                j: peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k) for j in others
            }
            logs_before = {j: len(mesh.daemons[j].log_text()) for j in others}
            wg_pid = await wireguard_go_of(mesh.daemons[k])

            killed = time.monotonic()
            mesh.daemons[k].kill()
            os.kill(wg_pid, signal.SIGKILL)
            assert await mesh.daemons[k].wait(5) == -signal.SIGKILL
            restarted = await mesh.start_rank(k)
            await wait_log(restarted, "took over its own entry", 20)
            claimed_at = mesh.claimed_at(k)
            assert claimed_at is not None
            gaps = await measure_outages(mesh, k, killed, timeout=15)
            after_claim = {
                pair: round(o.resumed - claimed_at, 2)
                for pair, o in gaps.items()
                if o.resumed is not None
            }
            print(
                f"fresh restart: claimed {claimed_at - killed:.2f} s after the kill; "
                f"outages (s): {fmt(gaps)}; flowing again after the claim (s): {after_claim}"
            )
            assert "adopted" not in restarted.log_text()
            assert_measured(gaps)
            late = {pair: t for pair, t in after_claim.items() if t > RESUMED_AFTER_CLAIM}
            assert not late, f"flowing again only after the claim by {late}: {fmt(gaps)}"
            # A fresh device has a new device id: each other rank re-adds the peer
            # once (to drop the dead session) and changes nothing else about it.
            for j in others:
                text = mesh.daemons[j].log_text()[logs_before[j] :]
                assert plan_lines_about(text, k) == [], text
                assert text.count(f"peer rank {k} restarted its device") == 1, text
                after = peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k)
                assert after == before[j], (j, after, before[j])
            assert mesh.dead_daemons() == {}


# --- scenario 9: wireguard-go dies -----------------------------------------------------------


async def test_dead_wireguard_go_is_restarted_and_the_state_reapplied() -> None:
    k = 0
    with trio.fail_after(90):
        async with open_lab(3) as lab:
            mesh = MeshLab.create(lab)
            for rank in range(3):
                await mesh.start_rank(rank)
            await start_probes(mesh)
            await form(mesh)
            daemon = mesh.daemons[k]
            others = [r for r in range(3) if r != k]
            before = {
                j: peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k) for j in others
            }
            logs_before = {j: len(mesh.daemons[j].log_text()) for j in others}
            wanted = await device_peers(mesh, daemon)
            assert wanted is not None and len(wanted) == 2
            wg_pid = await wireguard_go_of(daemon)

            killed, killed_wall = time.monotonic(), time.time()
            os.kill(wg_pid, signal.SIGKILL)
            with trio.fail_after(WG_RESTART_GAP):
                while True:
                    assert daemon.returncode is None, daemon.log_text()[-3000:]
                    peers = await device_peers(mesh, daemon)
                    if peers == wanted:  # same keys, endpoints and allowed IPs
                        break
                    await trio.sleep(0.02)
            seen_back = time.monotonic() - killed
            await wait_log(daemon, "after wireguard-go restart: re-applied", 5)
            (logged,) = [t for t, m in log_lines(daemon) if "after wireguard-go restart" in m]
            reapplied = logged - killed_wall
            gaps = await measure_outages(mesh, k, killed, timeout=10)
            print(
                f"wireguard-go killed: peers re-applied {reapplied:.3f} s after the kill (log), "
                f"seen on the device after {seen_back:.2f} s; outages (s): {fmt(gaps)}"
            )
            assert reapplied <= REAPPLIED_WITHIN, f"peers re-applied {reapplied:.3f} s after"
            assert_measured(gaps)
            assert all(o.gap is not None and o.gap <= WG_RESTART_GAP for o in gaps.values()), fmt(
                gaps
            )

            assert daemon.returncode is None, daemon.log_text()
            assert await wireguard_go_of(daemon) != wg_pid
            log = daemon.log_text()
            assert f"wireguard-go pid {wg_pid} exited with code -9" in log, log
            assert re.search(r"re-applied 2 peer\(s\)", log), log
            routes = await lab.run(mesh.pod(k), ["ip", "-o", "route", "show", "dev", "vnet0"])
            assert sorted(
                line.split()[0] for line in routes.stdout.decode().splitlines()
            ) == sorted(mesh.address(j) for j in others)
            # The other ranks kept key, port and endpoint; they re-added the peer
            # once, when rank k's entry announced its new device id.
            for j in others:
                text = mesh.daemons[j].log_text()[logs_before[j] :]
                assert plan_lines_about(text, k) == [], text
                with trio.fail_after(10):
                    while f"peer rank {k} restarted its device" not in mesh.daemons[j].log_text():
                        await trio.sleep(0.1)
                text = mesh.daemons[j].log_text()[logs_before[j] :]
                assert text.count(f"peer rank {k} restarted its device") == 1, text
                assert peer_of(await device_peers(mesh, mesh.daemons[j]), mesh, k) == before[j]


# --- the interface belongs to something else -----------------------------------------------


async def test_refuses_an_interface_that_belongs_to_something_else() -> None:
    """No registry is needed: the device comes up (or is refused) before it is used."""
    with trio.fail_after(60):
        async with open_lab(3, with_etcd=False) as lab:
            mesh = MeshLab.create(lab)

            # Another kind of link named vnet0 in the pod's network namespace.
            made = await lab.run(mesh.pod(0), ["ip", "link", "add", "vnet0", "type", "bridge"])
            assert made.returncode == 0, made.stderr
            daemon = await mesh.start_rank(0)
            assert await daemon.wait(20) == 2, daemon.log_text()
            last = daemon.log_text().strip().splitlines()[-1]
            print(f"bridge vnet0: {last}")
            assert last.startswith("vnetd: error: interface vnet0 already exists (kind bridge)")
            assert "[mesh] interface" in last
            link = await lab.run(mesh.pod(0), ["ip", "-d", "-o", "link", "show", "vnet0"])
            assert link.returncode == 0 and "bridge" in link.stdout.decode()

            # A wireguard-go with another key serving vnet0 where the daemon looks for it.
            sandbox = await start_sandbox(lab, 1)
            foreign = await lab.start(
                mesh.pod(1), ["wireguard-go", "-f", "vnet0"], WG_ENV, beside=sandbox
            )
            with trio.fail_after(10):
                while await wg(mesh, sandbox, "show", "vnet0") is None:
                    await trio.sleep(0.05)
            setkey = ("umask 077 && wg genkey > /run/wireguard/k && "
                      "wg set vnet0 private-key /run/wireguard/k listen-port 51999 && rm /run/wireguard/k")  # fmt: skip
            done = await lab.run(mesh.pod(1), ["sh", "-c", setkey], beside=sandbox)
            assert done.returncode == 0, done.stderr
            dump = await wg(mesh, sandbox, "show", "vnet0", "dump")
            daemon = await start_beside(mesh, 1, sandbox)
            assert await daemon.wait(20) == 2, daemon.log_text()
            last = daemon.log_text().strip().splitlines()[-1]
            print(f"foreign wireguard-go: {last}")
            assert last.startswith("vnetd: error: interface vnet0: ")
            assert f"pid {foreign.pid}" in last and "another private key" in last, last
            assert "[mesh] interface" in last
            # Untouched: same key, port and (no) peers, still running, no address added.
            assert await wg(mesh, sandbox, "show", "vnet0", "dump") == dump
            assert foreign.returncode is None
            addr = await lab.run(mesh.pod(1), ["ip", "-o", "addr", "show", "dev", "vnet0"])
            assert "inet " not in addr.stdout.decode()

            # A wireguard-go that outlived its daemon, restarted in a new mount
            # namespace (no shared /run/wireguard): its socket is not visible, so
            # its tun cannot be told from someone else's. Refused; the fix named
            # in the message (deleting the link) stops it, and the next start works.
            first = await mesh.start_rank(2)
            await wait_log(first, "wireguard-go pid", 20)
            orphan = await wireguard_go_of(first)
            first.kill()
            await first.wait(5)
            daemon = await mesh.start_rank(2)
            assert await daemon.wait(20) == 2, daemon.log_text()
            last = daemon.log_text().strip().splitlines()[-1]
            print(f"unseen wireguard-go: {last}")
            assert last.startswith("vnetd: error: interface vnet0 already exists (kind tun)")
            assert "a wireguard-go whose socket is not visible here" in last
            assert alive(orphan)
            gone = await lab.run(mesh.pod(2), ["ip", "link", "del", "vnet0"])
            assert gone.returncode == 0, gone.stderr
            with trio.fail_after(5):
                while alive(orphan):
                    await trio.sleep(0.05)
            daemon = await mesh.start_rank(2)
            await wait_log(daemon, "wireguard-go pid", 20)
            assert "up in" in daemon.log_text()
