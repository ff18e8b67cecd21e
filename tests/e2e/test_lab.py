"""The netns lab itself: topology, isolation, etcd, probe, and leak-free teardown."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from vnetd.lab import open_lab as lab_module
from vnetd.lab.netns import add_netns, list_netns, pid_alive
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.lab.probe import parse_events, probe_command

HEALTH = (
    "import sys, urllib.request;"
    "print(urllib.request.urlopen(sys.argv[1] + '/health', timeout=2).read().decode())"
)


async def etcd_health(lab: Lab, pod_index: int = 0) -> dict[str, object] | None:
    """etcd's /health as seen from a pod, or None when it does not answer."""
    result = await lab.run(lab.pods[pod_index], [sys.executable, "-c", HEALTH, lab.etcd_url], 10)
    if result.returncode != 0:
        return None
    health: dict[str, object] = json.loads(result.stdout)
    return health


async def assert_gone(netns: list[str], pids: list[int], workdir: Path | None = None) -> None:
    remaining = set(await list_netns()) & set(netns)
    assert not remaining, f"namespaces left: {remaining}"
    alive = [pid for pid in pids if pid_alive(pid)]
    assert not alive, f"processes left: {alive}"
    if workdir is not None:
        assert not await trio.Path(workdir).exists()


async def test_three_pods_ping_each_other_over_the_underlay(lab: Lab) -> None:
    with trio.fail_after(30):
        assert [p.underlay_ip for p in lab.pods] == ["198.18.1.0", "198.18.1.1", "198.18.1.2"]
        assert len({p.netns for p in lab.pods}) == 3
        for src in lab.pods:
            routes = await lab.run(src, ["ip", "route", "show", "default"], 5)
            assert routes.stdout.strip() == b"", "a pod must have no default route"
            for dst in lab.pods:
                if dst is not src:
                    ping = await lab.run(src, ["ping", "-c", "1", "-W", "2", dst.underlay_ip], 5)
                    assert ping.returncode == 0, ping.stdout.decode() + ping.stderr.decode()


async def test_nothing_is_created_in_the_root_namespace(lab: Lab) -> None:
    with trio.fail_after(10):
        links = await trio.run_process(["ip", "-o", "link"], capture_stdout=True)
        names = {
            line.split(":")[1].strip().split("@")[0] for line in links.stdout.decode().splitlines()
        }
        assert not names & {"br0", "eth0", "etcd", *(f"p{p.index}" for p in lab.pods)} - {"eth0"}
        assert set(lab.netns_names) <= set(await list_netns())


async def test_a_pod_reaches_etcd_health(lab: Lab) -> None:
    with trio.fail_after(30):
        assert lab.etcd_url == "http://198.18.0.10:2379"
        assert await etcd_health(lab, 2) == {"health": "true"}


async def test_pods_have_separate_run_wireguard(lab: Lab) -> None:
    with trio.fail_after(30):
        writer = await lab.start(
            lab.pods[0], ["sh", "-c", "echo pod0 > /run/wireguard/only-pod0; exec sleep 60"]
        )
        written = trio.Path(f"/proc/{writer.pid}/root/run/wireguard/only-pod0")
        for _ in range(100):
            if await written.exists():
                break
            await trio.sleep(0.05)
        assert await written.read_text() == "pod0\n"
        root_view = trio.Path("/run/wireguard/only-pod0")
        assert not await root_view.exists(), "leaked into the root mount ns"
        reader = await lab.start(
            lab.pods[1], ["sh", "-c", "ls -A /run/wireguard; test ! -e /run/wireguard/only-pod0"]
        )
        assert await reader.wait(10) == 0, reader.log_text()
        assert reader.log_text() == ""
        assert writer.returncode is None
        assert await writer.stop() == -signal.SIGTERM
        assert not pid_alive(writer.pid)


async def test_state_dir_persists_across_restarts(lab: Lab) -> None:
    with trio.fail_after(30):
        pod = lab.pods[1]
        first = await lab.start(pod, ["sh", "-c", f"echo key > {pod.state_dir}/key"])
        assert await first.wait(10) == 0
        second = await lab.start(pod, ["cat", str(pod.state_dir / "key")])
        assert await second.wait(10) == 0
        assert second.log_text() == "key\n"
        assert first.log_path != second.log_path
        assert second.log_path.parent == pod.log_dir


async def test_etcd_can_be_stopped_and_started_again(lab: Lab) -> None:
    with trio.fail_after(60):
        ctl = ["etcdctl", "--endpoints", lab.etcd_url, "--dial-timeout=2s", "--command-timeout=2s"]
        put = await lab.run(lab.pods[0], [*ctl, "put", "/lab/k", "v1"], 10)
        assert put.returncode == 0, put.stderr
        assert lab.etcd is not None
        old_pid = lab.etcd.pid
        await lab.stop_etcd()
        assert not pid_alive(old_pid)
        assert await etcd_health(lab) is None
        await lab.start_etcd()
        assert lab.etcd.pid not in (0, old_pid)
        assert await etcd_health(lab) == {"health": "true"}
        get = await lab.run(lab.pods[1], [*ctl, "get", "--print-value-only", "/lab/k"], 10)
        assert get.stdout.decode().strip() == "v1"


async def test_etcd_can_start_after_the_pods() -> None:
    with trio.fail_after(60):
        async with open_lab(2, with_etcd=False) as lab:
            assert lab.etcd is None
            assert await etcd_health(lab) is None
            await lab.start_etcd()
            assert await etcd_health(lab, 1) == {"health": "true"}


async def test_exit_leaves_no_namespace_process_or_dir() -> None:
    with trio.fail_after(60):
        async with open_lab(3) as lab:
            procs = [await lab.start(pod, ["sleep", "300"]) for pod in lab.pods]
            # One that ignores SIGTERM: teardown must SIGKILL it.
            procs.append(await lab.start(lab.pods[0], ["sh", "-c", "trap '' TERM; sleep 300"]))
            assert lab.etcd is not None
            pids = [p.pid for p in procs] + [lab.etcd.pid]
            netns, workdir = lab.netns_names, lab.workdir
            assert (lab_module.LAB_RUN_DIR / f"{lab.id}.json").exists()
            assert all(pid_alive(pid) for pid in pids)
        await assert_gone(netns, pids, workdir)
        assert not (lab_module.LAB_RUN_DIR / f"{lab.id}.json").exists()
        assert all(p.returncode is not None for p in procs)


async def test_an_exception_inside_the_lab_still_tears_everything_down() -> None:
    seen: dict[str, object] = {}

    async def fail_inside_lab() -> None:
        async with open_lab(2) as lab:
            proc = await lab.start(lab.pods[1], ["sleep", "300"])
            assert lab.etcd is not None
            seen.update(pids=[proc.pid, lab.etcd.pid], netns=lab.netns_names, dir=lab.workdir)
            raise RuntimeError("boom")

    with trio.fail_after(60):
        with pytest.raises(RuntimeError, match="boom"):
            await fail_inside_lab()
        await assert_gone(seen["netns"], seen["pids"], seen["dir"])  # type: ignore[arg-type]


async def test_cancellation_inside_the_lab_still_tears_everything_down() -> None:
    with trio.fail_after(60):
        with trio.move_on_after(2) as scope:
            async with open_lab(2) as lab:
                proc = await lab.start(lab.pods[0], ["sleep", "300"])
                assert lab.etcd is not None
                pids, netns, workdir = [proc.pid, lab.etcd.pid], lab.netns_names, lab.workdir
                await trio.sleep_forever()
        assert scope.cancelled_caught
        await assert_gone(netns, pids, workdir)


async def test_a_given_workdir_is_kept(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_lab(1, workdir=tmp_path / "lab", with_etcd=False) as lab:
            assert lab.pods[0].state_dir == tmp_path / "lab" / "pod0" / "state"
        assert lab.pods[0].state_dir.is_dir()


async def test_probe_reaches_the_other_pod_and_survives_no_route(lab: Lab) -> None:
    with trio.fail_after(30):
        a, b = lab.pods[0], lab.pods[1]
        no_route = "10.250.0.1"  # outside the underlay; pods have no default route
        probes = [
            await lab.start(
                pod,
                probe_command(
                    pod.underlay_ip,
                    [a.underlay_ip, b.underlay_ip, no_route],
                    duration=1.5,
                    interval=0.05,
                ),  # fmt: skip
            )
            for pod in (a, b)
        ]
        for probe, pod, other in zip(probes, (a, b), (b, a), strict=True):
            assert await probe.wait(10) == 0, probe.log_text()
            events = parse_events(probe.log_text())
            assert events[0]["event"] == "started"
            reached = [e["target"] for e in events if e["event"] == "reached"]
            assert reached == [other.underlay_ip], probe.log_text()
            summary = events[-1]
            assert summary["event"] == "summary"
            assert pod.underlay_ip not in summary["sent"]
            assert summary["received"][other.underlay_ip] > 10
            assert summary["received"][no_route] == 0
            assert summary["errors"][no_route] == summary["sent"][no_route] > 0


async def test_probe_prints_a_summary_on_sigterm(lab: Lab) -> None:
    with trio.fail_after(30):
        pod = lab.pods[2]
        probe = await lab.start(pod, probe_command(pod.underlay_ip, [lab.pods[0].underlay_ip],
                                                   duration=600))  # fmt: skip
        for _ in range(200):
            if parse_events(probe.log_text()):
                break
            await trio.sleep(0.05)
        assert await probe.stop(timeout=5) == 0
        assert parse_events(probe.log_text())[-1]["event"] == "summary"


async def test_cleanup_removes_labs_of_dead_owners_only(lab: Lab) -> None:
    with trio.fail_after(30):
        dead = await trio.lowlevel.open_process(["true"])
        await dead.wait()
        stale_id = next(
            f"{i:04x}" for i in range(0xFFFF, 0, -1)
            if not (lab_module.LAB_RUN_DIR / f"{i:04x}.json").exists()
        )  # fmt: skip
        marker = lab_module.LAB_RUN_DIR / f"{stale_id}.json"
        marker.write_text(json.dumps({"pid": dead.pid, "start": 1, "workdir": None}))
        stale_ns = f"vlab-{stale_id}-pod0"
        await add_netns([stale_ns])
        squatter = await trio.lowlevel.open_process(
            ["ip", "netns", "exec", stale_ns, "sleep", "300"]
        )
        try:
            for _ in range(100):
                if os.readlink(f"/proc/{squatter.pid}/exe").endswith("sleep"):
                    break
                await trio.sleep(0.02)
            removed = await lab_module.cleanup_stale_labs()
            assert stale_id in removed
            assert lab.id not in removed
            assert stale_ns not in await list_netns()
            assert set(lab.netns_names) <= set(await list_netns())
            assert not marker.exists()
            with trio.fail_after(5):
                await squatter.wait()
        finally:
            squatter.kill()
            await squatter.wait()


async def test_a_process_can_get_its_own_hostname(lab: Lab) -> None:
    with trio.fail_after(20):
        root_hostname = (await trio.run_process(["hostname"], capture_stdout=True)).stdout
        named = await lab.start(lab.pods[0], ["hostname"], hostname="lab-0")
        assert await named.wait(10) == 0
        assert named.log_text().strip() == "lab-0"
        after = (await trio.run_process(["hostname"], capture_stdout=True)).stdout
        assert after == root_hostname, "the root namespace's hostname must not change"


async def test_a_process_beside_another_shares_its_namespaces(lab: Lab) -> None:
    with trio.fail_after(20):
        marker = "/run/wireguard/vlab-beside-test"
        script = f"touch {marker} && hostname && sleep 30"
        holder = await lab.start(lab.pods[1], ["sh", "-c", script], hostname="side-1")
        for _ in range(100):
            if holder.log_text().strip():
                break
            await trio.sleep(0.05)
        beside = await lab.run(
            lab.pods[1], ["sh", "-c", f"ls {marker} && hostname"], 5, beside=holder
        )
        assert beside.stdout.decode().split() == [marker, "side-1"], beside.stderr
        elsewhere = await lab.run(lab.pods[1], ["ls", marker], 5)
        assert elsewhere.returncode != 0, "the private /run/wireguard must not leak"
        await holder.stop()


async def test_a_pod_can_move_to_a_new_underlay_address(lab: Lab) -> None:
    with trio.fail_after(20):
        moved = await lab.move_pod(lab.pods[2], "198.18.3.2")
        assert lab.pods[2] is moved and moved.underlay_ip == "198.18.3.2"
        addrs = await lab.run(moved, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], 5)
        assert "198.18.3.2/15" in addrs.stdout.decode()
        assert "198.18.1.2/" not in addrs.stdout.decode()
        ping = await lab.run(lab.pods[0], ["ping", "-c", "1", "-W", "2", "198.18.3.2"], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        with pytest.raises(ValueError, match="underlay"):
            await lab.move_pod(moved, "10.0.0.1")


async def test_static_neighbours_pin_every_underlay_address_without_arp() -> None:
    async with open_lab(3, static_neighbours=True, ipv6=True) as lab:
        with trio.fail_after(40):
            hosts = [(p, p.underlay_ip, p.underlay_ip6) for p in lab.pods]
            for src in lab.pods:
                for dst, ip4, ip6 in hosts:
                    if dst is src:
                        continue
                    for addr in (ip4, ip6):
                        assert addr is not None
                        ping = await lab.run(src, ["ping", "-c", "1", "-W", "2", addr], 5)
                        assert ping.returncode == 0, ping.stdout.decode()
                assert await etcd_health(lab, src.index) is not None
                neigh = await lab.run(src, ["ip", "-j", "neigh", "show", "dev", "eth0"], 5)
                entries = {e["dst"]: e for e in json.loads(neigh.stdout)}
                others = [a for d, *addrs in hosts if d is not src for a in addrs]
                for addr in [*others, lab_module.ETCD_IP]:
                    assert addr in entries, f"{src.name}: no entry for {addr}: {entries}"
                    assert entries[addr]["state"] == ["PERMANENT"], entries[addr]
                learned = [e for e in entries.values() if e["state"] != ["PERMANENT"]
                           and not e["dst"].startswith("fe80:")]  # fmt: skip
                assert not learned, f"{src.name} resolved by ARP/ND: {learned}"
            moved = await lab.move_pod(lab.pods[2], "198.18.3.2")
            ping = await lab.run(lab.pods[0], ["ping", "-c", "1", "-W", "2", "198.18.3.2"], 5)
            assert ping.returncode == 0, ping.stdout.decode()
            neigh = await lab.run(lab.pods[0], ["ip", "-j", "neigh", "show", "dev", "eth0"], 5)
            entries = {e["dst"]: e["state"] for e in json.loads(neigh.stdout)}
            assert entries.get(moved.underlay_ip) == ["PERMANENT"]
            assert "198.18.1.2" not in entries
