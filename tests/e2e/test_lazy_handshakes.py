"""Handshakes follow the traffic (``mesh.tree_fanout``): real etcd, real wireguard-go.

Five ranks with ``tree_fanout = 1`` (a chain, 0-1-2-3-4): the four tree pairs
handshake when they are added; the six others are lazy, held on both
devices (key, route, endpoint) with no handshake and no keepalive until their
first packet. A first packet between two such ranks that never spoke must be
answered without WireGuard's 5 s retry: from the pair's initiator alone,
from its responder alone (whose first handshake rings the initiator's
doorbell), and from both sides at the same instant (the crossing that
bench/lazy_handshake.py measured losing 23 first packets of 50 to the retry);
and again once a rank's wireguard-go was killed and started afresh.
The prober is bench/first_packet.py; everything runs in the lab's namespaces.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import trio
from bounds import WG_RETRY
from test_faults_process import registry_entry, wireguard_go_of

from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.open_lab import Lab, LabError, open_lab
from vnetd.spec import load_spec

SIZE = 5
FANOUT = 1
TREE = {(0, 1), (1, 2), (2, 3), (3, 4)}
PROBER = Path(__file__).resolve().parents[2] / "bench" / "first_packet.py"
ANSWERED_WITHIN = 2.0
"""A lazy pair's first packet is answered within this long: below WireGuard's 5 s retry
(WG_RETRY), which a lost first handshake waits for; above a ring's re-add, its 0.25 s
settle and one initiator retry (1 s) on loaded cores."""
SETTLED = 20.0
"""Every rank started, claimed and holding every peer within this long."""
METRICS = "127.0.0.1:9109"


def lazy_mesh(lab: Lab) -> MeshLab:
    """The lab's mesh with ``tree_fanout = FANOUT``."""
    mesh = MeshLab.create(lab)
    text = mesh.spec_path.read_text()
    mesh.spec_path.write_text(text.replace("[mesh]\n", f"[mesh]\ntree_fanout = {FANOUT}\n", 1))
    mesh.spec = load_spec(mesh.spec_path)
    return mesh


async def wait_settled(mesh: MeshLab) -> None:
    """Every rank holds every other as a peer, and the tree pairs have handshaken."""
    with trio.fail_after(SETTLED):
        for rank in range(SIZE):
            while await ranks_held(mesh, rank) != set(range(SIZE)) - {rank}:
                await trio.sleep(0.1)
        for a, b in TREE:
            while not await handshaken(mesh, a, b):
                await trio.sleep(0.1)


async def ranks_held(mesh: MeshLab, rank: int) -> set[int]:
    """The peers on ``rank``'s device; none while its wireguard-go is starting."""
    try:
        return await mesh.device_ranks(rank)
    except LabError:
        return set()


async def handshaken(mesh: MeshLab, a: int, b: int) -> bool:
    """``a``'s device has a handshake with ``b``."""
    address = f"{mesh.address(b)}/32"
    return any(address in row[3].split(",") and row[4] != "0" for row in await mesh.device_dump(a))


Pair = tuple[int, int]


async def first_packets(
    mesh: MeshLab, senders: dict[Pair, set[int]]
) -> dict[tuple[Pair, int], float | None]:
    """Run the prober on each pair's two ranks from one shared instant; ``senders`` names
    who sends in each pair. Returns (pair, sender) -> seconds to the first reply."""
    go = time.monotonic() + 1.5
    out: dict[tuple[Pair, int], float | None] = {}

    ports = {pair: 7780 + i for i, pair in enumerate(sorted(senders))}

    async def run(pair: Pair, rank: int, other: int) -> None:
        argv = [sys.executable, str(PROBER), "--self-addr", mesh.address(rank),
                "--peer-addr", mesh.address(other), "--go", repr(go), "--limit", "7",
                "--port", str(ports[pair])]  # fmt: skip
        if rank in senders[pair]:
            argv.append("--send")
        if other in senders[pair]:
            argv.append("--expect")
        result = await mesh.lab.run(mesh.pod(rank), argv, 15)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        reply = json.loads(result.stdout.decode().strip().splitlines()[-1])["reply"]
        if rank in senders[pair]:
            out[(pair, rank)] = reply

    async with trio.open_nursery() as nursery:
        for pair in senders:
            a, b = pair
            nursery.start_soon(run, pair, a, b)
            nursery.start_soon(run, pair, b, a)
    return out


async def handshakes_initiated(mesh: MeshLab, rank: int) -> float:
    status, body = await http_get(mesh.lab, mesh.pod(rank), f"http://{METRICS}/metrics")
    assert status == 200, body
    match = re.search(r"^vnetd_handshakes_initiated_total (\S+)$", body, re.M)
    assert match, body[:500]
    return float(match.group(1))


async def test_a_lazy_pairs_first_packet_is_answered_without_the_5s_retry():
    async with open_lab(SIZE) as lab:
        mesh = lazy_mesh(lab)
        for rank in range(SIZE):  # in order: the lower rank registers first and initiates
            await mesh.start_rank(rank, "--http-listen", METRICS)
            await trio.sleep(0.3)
        await wait_settled(mesh)
        lazy = [(a, b) for a in range(SIZE) for b in range(a + 1, SIZE) if (a, b) not in TREE]
        for a, b in lazy:
            assert not await handshaken(mesh, a, b), f"lazy pair {a}-{b} handshook unasked"
        started = [await handshakes_initiated(mesh, rank) for rank in range(SIZE)]
        print(f"handshakes started per rank after formation: {started}")
        assert sum(started) <= SIZE * (FANOUT + 2)
        # Initiator alone (0 -> 2), responder alone (4 -> 0, 3 -> 1: the doorbell), and
        # both at the same instant (0-3, 1-4, 2-4: the crossing).
        senders = {(0, 2): {0}, (0, 4): {4}, (1, 3): {3}, (0, 3): {0, 3}, (1, 4): {1, 4},
                   (2, 4): {2, 4}}  # fmt: skip
        assert set(senders) == set(lazy)
        replies = await first_packets(mesh, senders)
        print(f"first replies (s): {sorted(replies.items())}")
        slow = {k: v for k, v in replies.items() if v is None or v >= ANSWERED_WITHIN}
        assert not slow, f"first packets stalled (WireGuard retries after {WG_RETRY} s): {slow}"
        for a, b in lazy:
            assert await handshaken(mesh, a, b)

        # Rank 4's wireguard-go dies and comes back empty (a new device id): its lazy
        # peers drop their stale sessions, and the next first packets start new ones.
        before = (await registry_entry(mesh, 4))["device_id"]
        os.kill(await wireguard_go_of(mesh.daemons[4]), signal.SIGKILL)
        with trio.fail_after(SETTLED):
            while (await registry_entry(mesh, 4))["device_id"] == before:
                await trio.sleep(0.1)
            for rank in (0, 1, 2):
                while await handshaken(mesh, rank, 4):  # the stale session, until re-added
                    await trio.sleep(0.1)
        again = await first_packets(mesh, {(0, 4): {4}, (1, 4): {1}, (2, 4): {2, 4}})
        print(f"first replies after rank 4's device restarted (s): {sorted(again.items())}")
        slow = {k: v for k, v in again.items() if v is None or v >= ANSWERED_WITHIN}
        assert not slow, f"first packets stalled after a device restart: {slow}"
