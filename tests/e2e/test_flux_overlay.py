"""A Flux-like ZeroMQ tree over the overlay, configured only by ``vnetd render flux``.

Eight pods; each runs ``vnetd up`` and a broker (``zmq_broker.py``) that
finds its rank by its hostname in the rendered bootstrap file, binds and
connects where that file says, and sends hello and beats towards rank 0.
Every worker starts before rank 0, in a random order. Then one worker's pod
dies and comes back with a new underlay address; it must say hello again
while rank 0's processes and every config file stay as they were.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, LabProcess, open_lab

PODS = 8
HELLO_WITHIN = 10.0
"""Every hello (and every beat after the restart) arrives within this long of the claim of
the rank that came last, measured 0.6-2.2 s after rank 0's start: below the watch's 60 s
restart. There is no window below WireGuard's 5 s retry here: a first TCP SYN dropped
with a dropped first handshake waits for the initiator's retry (about 1 s) and the SYN's own
retransmission
(1 s, then 2 s), so a normal hello can come 3-5 s after the claim, as late as a retried
handshake would. The launcher bench carries that figure (bench/launcher.py,
docs/benchmarks.md section 3)."""
CLAIM_AFTER_HELLO = 4.5
"""A restarted rank's claim, once its hello has come: the daemon is the same instance, so
it takes its entry over at once; below the lab's 5 s lease TTL, which a daemon that waited
for its old lease to expire would take."""
BROKER = Path(__file__).with_name("zmq_broker.py")


def render_bootstrap(spec_path: Path, out: Path, fanout: int | None) -> None:
    argv = [sys.executable, "-m", "vnetd", "render", "flux", "--config", str(spec_path)]
    argv += ["-o", str(out), *(["--fanout", str(fanout)] if fanout else [])]
    subprocess.run(argv, check=True, timeout=30)


async def start_broker(lab: Lab, mesh: MeshLab, rank: int, bootstrap: Path) -> LabProcess:
    argv = [sys.executable, str(BROKER), str(bootstrap), "--duration", "300"]
    return await lab.start(mesh.pod(rank), argv, private_mount=False, hostname=mesh.spec.host(rank))


def events(broker: LabProcess) -> list[dict[str, Any]]:
    found = []
    for line in broker.log_text().splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def hellos(root: LabProcess) -> dict[int, list[dict[str, Any]]]:
    """Every hello rank 0 received, by sender rank."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for event in events(root):
        if event["event"] == "hello":
            by_rank.setdefault(event["rank"], []).append(event)
    return by_rank


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def wait_until(condition: Any, what: str, timeout: float, why: Any = None) -> None:  # noqa: ASYNC109
    """Poll ``condition()`` every 50 ms for at most ``timeout`` s; on a timeout, the
    assertion carries ``why()`` too (what the processes said)."""
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"{what}: not within {timeout:.0f} s" + (f"\n{why()}" if why else ""))


def last_words(mesh: MeshLab, brokers: dict[int, LabProcess], ranks: list[int]) -> str:
    """The daemons that died, and the last log lines of ``ranks``' daemons and brokers."""
    told = [f"dead daemons (rank: exit code): {mesh.dead_daemons()}"]
    for rank in ranks:
        for name, process in (("vnetd", mesh.daemons.get(rank)), ("broker", brokers.get(rank))):
            if process is not None:
                tail = process.log_text().splitlines()[-8:]
                told.append(f"rank {rank} {name}:\n  " + "\n  ".join(tail))
    return "\n".join(told)


@pytest.mark.parametrize(
    ("fanout", "restarted"),
    [
        pytest.param(None, 5, id="rank0-parent-of-all"),
        pytest.param(2, 1, id="binary-tree-interior-restart"),
    ],
)
async def test_every_rank_says_hello_to_rank0_and_again_after_moving(
    fanout: int | None, restarted: int
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}")
    with trio.fail_after(150):
        async with open_lab(PODS) as lab:
            mesh = MeshLab.create(lab)
            bootstrap = lab.workdir / "flux-bootstrap.toml"
            render_bootstrap(mesh.spec_path, bootstrap, fanout)
            configs = {p: sha256(p) for p in (bootstrap, mesh.spec_path)}

            brokers: dict[int, LabProcess] = {}
            workers = list(range(1, PODS))
            rng.shuffle(workers)
            for rank in [*workers, 0]:
                await mesh.start_rank(rank)
                brokers[rank] = await start_broker(lab, mesh, rank, bootstrap)
                await trio.sleep(rng.uniform(0.0, 0.5))
            root = brokers[0]
            everyone = set(range(1, PODS))
            await wait_until(
                lambda: set(hellos(root)) >= everyone,
                f"hellos at rank 0 (have {sorted(hellos(root))}, order {[*workers, 0]})",
                HELLO_WITHIN,
                lambda: last_words(mesh, brokers, [0, *sorted(everyone - set(hellos(root)))]),
            )
            last_hello = max(e["t"] for got in hellos(root).values() for e in got)
            claimed = mesh.claimed_at(0)
            assert claimed is not None
            print(f"all hellos {last_hello - mesh.started_at[0]:.2f} s after rank 0 started, "
                  f"{last_hello - claimed:.2f} s after its claim")  # fmt: skip
            assert last_hello - claimed < HELLO_WITHIN

            root_pids = (mesh.daemons[0].pid, root.pid)
            old_boot = hellos(root)[restarted][-1]["boot"]
            await lab.kill_pod(mesh.pod(restarted))
            moved = await lab.move_pod(mesh.pod(restarted), f"198.18.2.{restarted}")
            await mesh.start_rank(restarted)
            brokers[restarted] = await start_broker(lab, mesh, restarted, bootstrap)

            def said_hello_again() -> bool:
                return any(e["boot"] != old_boot for e in hellos(root).get(restarted, []))

            await wait_until(
                said_hello_again, f"rank {restarted} hello again", HELLO_WITHIN,
                lambda: last_words(mesh, brokers, [0, restarted]),
            )  # fmt: skip
            again = next(e for e in hellos(root)[restarted] if e["boot"] != old_boot)
            # The hello may come first: the restarted daemon puts its known peers on its
            # device before it claims, and rank 0 takes its new endpoint from the handshake.
            await wait_until(
                lambda: mesh.claimed_at(restarted) is not None,
                f"rank {restarted}'s claim after its hello", CLAIM_AFTER_HELLO,
                lambda: last_words(mesh, brokers, [restarted]),
            )  # fmt: skip
            claimed = mesh.claimed_at(restarted)
            assert claimed is not None
            print(f"rank {restarted} hello again {again['t'] - claimed:.2f} s after its claim")
            assert again["t"] - claimed < HELLO_WITHIN

            def beats_from_all_after(t: float) -> set[int]:
                return {e["rank"] for e in events(root) if e["event"] == "beat" and e["t"] > t}

            # In the tree, ranks below the restarted one reach rank 0 through it.
            await wait_until(
                lambda: beats_from_all_after(again["t"]) >= everyone,
                f"beats from every rank after the restart (have {beats_from_all_after(again['t'])})",
                HELLO_WITHIN,
            )

            assert (mesh.daemons[0].pid, root.pid) == root_pids
            assert mesh.daemons[0].returncode is None and root.returncode is None
            assert {p: sha256(p) for p in configs} == configs, "no config may change"
            shown = await lab.run(
                mesh.pod(0), ["wg", "show", "vnet0", "endpoints"], 5, beside=mesh.daemons[0]
            )
            assert f"{moved.underlay_ip}:51820" in shown.stdout.decode(), shown.stdout
