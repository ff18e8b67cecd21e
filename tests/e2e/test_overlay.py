"""The overlay forms in any start order: real etcd, real wireguard-go, netns pods."""

from __future__ import annotations

import random
import time

import pytest
import trio
from bounds import form

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import open_lab

RANKS = 8


async def device_dump(mesh: MeshLab, rank: int) -> list[list[str]]:
    """``wg show vnet0 dump`` inside the daemon's own mount and network namespace."""
    pid = mesh.daemons[rank].pid
    result = await trio.run_process(
        ["nsenter", "-t", str(pid), "-m", "-n", "wg", "show", "vnet0", "dump"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return [line.split("\t") for line in result.stdout.decode().splitlines()[1:]]


async def assert_devices_consistent(mesh: MeshLab, ranks: set[int]) -> None:
    """Each device has one peer per other present rank, holding exactly that rank's /32."""
    for rank in ranks:
        peers = await device_dump(mesh, rank)
        allowed = sorted(p[3] for p in peers)
        expected = sorted(f"{mesh.address(r)}/32" for r in ranks - {rank})
        assert allowed == expected, f"rank {rank}: {allowed} != {expected}"


def start_order(kind: str, seed: int) -> list[int]:
    rng = random.Random(seed)
    order = list(range(RANKS))
    rng.shuffle(order)
    order.remove(0)
    if kind == "rank0-first":
        return [0, *order]
    if kind == "rank0-last":
        return [*order, 0]
    order.insert(rng.randrange(RANKS), 0)
    return order


@pytest.mark.parametrize("kind", ["rank0-first", "rank0-last", "shuffled"])
async def test_any_start_order_forms_full_mesh(kind):
    seed = random.randrange(1 << 30)
    order = start_order(kind, seed)
    rng = random.Random(seed)
    with trio.fail_after(150):
        async with open_lab(RANKS) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            for rank in order:
                await mesh.start_rank(rank)
                await trio.sleep(rng.uniform(0, 2))
            await form(mesh, what=f"order {order} (seed {seed})")
            assert mesh.dead_daemons() == {}
            await assert_devices_consistent(mesh, set(range(RANKS)))


async def test_ranks_started_before_etcd_join_when_it_appears():
    with trio.fail_after(120):
        async with open_lab(4, with_etcd=False) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            for rank in (3, 1, 0, 2):
                await mesh.start_rank(rank)
            # Each daemon must have met the outage before etcd starts (a fixed sleep let a
            # daemon slowed by load start after etcd and never log it).
            with trio.fail_after(60):
                while not all(
                    "registry unreachable" in d.log_text() for d in mesh.daemons.values()
                ):
                    await trio.sleep(0.1)
            await trio.sleep(2)
            assert mesh.dead_daemons() == {}, "a daemon exited while etcd was absent"
            assert mesh.first_reached() == {}
            began = time.monotonic()
            await lab.start_etcd()
            await form(mesh, since=began, what="after etcd's start")
            log = mesh.daemons[0].log_text()
            assert log.count("registry unreachable") == 1, "the outage is logged once, not per try"
            assert "registry reachable again" in log


async def connect(lab, pod, address: str, timeout: float) -> tuple[str, float]:
    """A TCP connect from inside ``pod``; returns (outcome, seconds)."""
    code = (
        "import socket,sys,time\n"
        "s=socket.socket(); s.settimeout(float(sys.argv[2])); t=time.monotonic()\n"
        "try:\n s.connect((sys.argv[1], 9)); r='connected'\n"
        "except OSError as e: r=type(e).__name__+':'+str(e.errno)\n"
        "print(r, time.monotonic()-t)\n"
    )
    result = await lab.run(
        pod, ["python3", "-c", code, address, str(timeout)], timeout=timeout + 10
    )
    outcome, seconds = result.stdout.decode().split()
    return outcome, float(seconds)


async def test_absent_rank_fails_fast_then_joins():
    with trio.fail_after(120):
        async with open_lab(4) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            for rank in (0, 1, 2):
                await mesh.start_rank(rank)
            await form(mesh, {0, 1, 2})

            outcome, seconds = await connect(lab, mesh.pod(0), mesh.address(3), timeout=3)
            assert outcome == f"OSError:{113}", outcome  # EHOSTUNREACH: No route to host
            assert seconds < 1.0
            assert mesh.dead_daemons() == {}

            await mesh.start_rank(3)
            await form(mesh, since=mesh.started_at[3], what="rank 3 joins")
            # Now the address answers (RST from the closed port: connection refused).
            outcome, _ = await connect(lab, mesh.pod(0), mesh.address(3), timeout=3)
            assert outcome == f"ConnectionRefusedError:{111}", outcome
            await assert_devices_consistent(mesh, {0, 1, 2, 3})


async def test_sigterm_revokes_lease_and_cleans_up():
    with trio.fail_after(90):
        async with open_lab(3) as lab:
            mesh = MeshLab.create(
                lab, ttl=30
            )  # a TTL long enough that only a revoke explains a fast drop
            await mesh.start_probes()
            for rank in range(3):
                await mesh.start_rank(rank)
            await form(mesh)
            stopped = time.monotonic()
            code = await mesh.daemons[2].stop()
            assert code == 0, mesh.daemons[2].log_text()
            with trio.fail_after(5):
                while len(await device_dump(mesh, 0)) != 1:
                    await trio.sleep(0.05)
            print(f"peer dropped {time.monotonic() - stopped:.2f} s after SIGTERM")
            links = await lab.run(mesh.pod(2), ["ip", "-o", "link", "show"])
            assert b"vnet0" not in links.stdout
            assert "lease revoked" in mesh.daemons[2].log_text()
            result = await trio.run_process(
                ["ip", "netns", "pids", mesh.pod(2).netns], capture_stdout=True, check=True
            )
            comms = [trio.Path(f"/proc/{pid}/comm") for pid in result.stdout.decode().split()]
            names = {(await comm.read_text()).strip() for comm in comms}
            assert "wireguard-go" not in names, names
