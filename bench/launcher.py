#!/usr/bin/env python3
"""The launcher of today, side by side with vnetd: time until every rank has said hello to rank 0.

Both sides run in the same lab, with the same N pods "created" in the same
random order with the same random gaps (uniform 0..``--max-gap`` s); the
side that goes first alternates from run to run.

**Launcher** (what the Flux operator did before fixed addresses): when a pod
is created, its process starts (a placeholder; it cannot know its peers).
Once every pod exists, so every pod's underlay address is known, the
launcher writes a hosts file for every pod (``/etc/netns/<pod>/hosts``,
which ``ip netns exec`` bind-mounts over ``/etc/hosts``: a process sees it
only if started after it was written), then restarts every pod's process
(SIGTERM, start again; all pods at once). Rank 0 serves; each worker
resolves ``lab-0`` through ``/etc/hosts``, connects over the underlay, says
hello and waits for ``ok``. A worker that fails (rank 0 not listening yet)
tries again 15 s later: the operator's loop (``bench/hello.py``).

**vnetd**: when a pod is created, its ``vnetd up`` and its broker start
together, as ``tests/e2e/test_flux_overlay.py`` does: the same broker,
``tests/e2e/zmq_broker.py``, reads the bootstrap file
rendered once by ``vnetd render flux`` before any pod exists, binds (rank 0)
or connects (workers, ZeroMQ DEALER, which retries on its own every 100 ms)
over the overlay, and sends hello to rank 0.

**Clocks** (``time.monotonic()``): each side's figure ends when rank 0 has
received a hello from every worker (rank 0's own log of it). It starts at
the *last* pod's creation (``from_last_pod``: every address exists, and
the launcher starts working), and is also given from the *first* pod's
creation (``from_first_pod``: the whole start-up a user waits for, the
creation span included, which is the same on both sides). The ratio is
launcher / vnetd.

**The last pod** (vnetd side): its daemon's start → ready, its own CPU when
it logged its claim (``/proc/<pid>/stat``, polled every 10 ms), and how busy
the machine's cores were from its start until then (``/proc/stat``): whether
a late last daemon did its own work or waited for a core.

Run alone: ``.venv/bin/python bench/launcher.py --sizes 8 --runs 1``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from common import (
    BENCH,
    JSON,
    ClockMap,
    JsonMesh,
    LoadSampler,
    base_parser,
    check_host,
    claim_time,
    cpu_jiffies,
    lab_netns,
    latency,
    merge_load,
    proc_cpu_seconds,
    run_each_size,
    runs_for,
    seeded,
    spread,
    spreads,
    summary_by_size,
    wait_for,
    write_result,
)

from vnetd.lab.open_lab import Lab, LabProcess, open_lab

NAME = "launcher"
TITLE = "The launcher of today, side by side"
BROKER = BENCH.parent / "tests" / "e2e" / "zmq_broker.py"
HELLO = BENCH / "hello.py"
NETNS_ETC = Path("/etc/netns")
HELLO_PORT = 8050
RETRY = 15.0
SIDE_TIMEOUT = 120.0


def hellos(process: LabProcess) -> dict[int, float]:
    """First hello time per worker rank, from rank 0's output."""
    first: dict[int, float] = {}
    for line in process.log_text().splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "hello":
                first.setdefault(int(event["rank"]), float(event["t"]))
    return first


async def stop_all(processes: Sequence[LabProcess]) -> None:
    async with trio.open_nursery() as nursery:
        for process in processes:
            nursery.start_soon(process.stop)


async def create_pods(
    order: list[int], gaps: list[float], start: Callable[[int], Any]
) -> dict[int, float]:
    """Call ``start(rank)`` for each rank in ``order`` with the gaps; when each was created."""
    created: dict[int, float] = {}
    for rank, gap in zip(order, gaps, strict=True):
        created[rank] = time.monotonic()
        await start(rank)
        await trio.sleep(gap)
    return created


async def vnetd_side(lab: Lab, size: int, order: list[int], gaps: list[float]) -> JSON:
    mesh = JsonMesh.create(lab)
    bootstrap = lab.workdir / "flux-bootstrap.toml"
    argv = [sys.executable, "-m", "vnetd", "render", "flux", "--config", str(mesh.spec_path),
            "-o", str(bootstrap)]  # fmt: skip
    await trio.run_process(argv, capture_stdout=True)
    brokers: dict[int, LabProcess] = {}
    last_start: JSON = {}

    async def start(rank: int) -> None:
        jiffies = cpu_jiffies()
        daemon = await mesh.start_rank(rank)
        argv = [sys.executable, str(BROKER), str(bootstrap), "--duration", "600",
                "--bind-wait", "120"]  # fmt: skip
        brokers[rank] = await lab.start(
            mesh.pod(rank), argv, private_mount=False, hostname=mesh.spec.host(rank)
        )
        if rank == order[-1]:
            nursery.start_soon(last_daemon_cost, mesh, rank, daemon.pid, jiffies, last_start)

    clock = ClockMap()
    try:
        async with trio.open_nursery() as nursery:
            created = await create_pods(order, gaps, start)
        workers = set(range(1, size))
        await wait_for(lambda: set(hellos(brokers[0])) >= workers, "vnetd: every hello",
                       SIDE_TIMEOUT, 0.1)  # fmt: skip
        said = hellos(brokers[0])
        claims = {r: claim_time(mesh.log(r), r) for r in range(size)}
        counters = {r: await ip_counters(mesh.pod(r).netns) for r in range(size)}
    finally:
        await stop_all([*brokers.values(), *mesh.daemons.values()])
    ready = {r: clock.to_monotonic(t) for r, t in claims.items() if t is not None}
    done = max(said.values())
    last = max(created.values())
    # A worker can say hello only once both it and rank 0 are ready.
    both = {r: max(ready[r], ready[0]) for r in workers if r in ready and 0 in ready}
    return {
        "from_first_pod": done - min(created.values()),
        "from_last_pod": done - last,
        "start_to_ready": latency([ready[r] - created[r] for r in ready]),
        "last_ready_after_last_pod": max(ready.values()) - last if ready else None,
        "ready_to_hello": latency([said[r] - both[r] for r in both if r in said]),
        # A worker's hello about 1 s late is a lost SYN or SYN-ACK: TCP sends it again
        # a second later. Rank 0 counts an answer it had no route for.
        "syn_resent_workers": sum(counters[r]["TcpExtTCPSynRetrans"] > 0 for r in workers),
        "rank0_no_route": counters[0]["IpOutNoRoutes"],
        # The last pod's own daemon (its claim was awaited): its wall to ready, and
        # (last_daemon_cost) its CPU.
        "last_start_to_ready": ready[order[-1]] - created[order[-1]],
        **last_start,
    }


async def last_daemon_cost(
    mesh: JsonMesh, rank: int, pid: int, jiffies: tuple[int, int], out: JSON
) -> None:
    """Into ``out``: the last pod's daemon's own CPU when it logged its claim, and how
    busy the machine's cores were from just before its start until then: whether its
    start -> ready was its own work or a wait for a core."""
    await wait_for(lambda: claim_time(mesh.log(rank), rank) is not None, "the last claim",
                   SIDE_TIMEOUT, 0.01)  # fmt: skip
    cpu = proc_cpu_seconds(pid)  # within ~10 ms of its log line
    busy, total = cpu_jiffies()
    out["last_daemon_cpu_s"] = cpu
    out["last_start_cores_busy"] = (busy - jiffies[0]) / max(total - jiffies[1], 1)


COUNTERS = ("IpOutNoRoutes", "TcpExtTCPSynRetrans")
"""What a pod's kernel counted that says a TCP connection's first packets were lost."""


async def ip_counters(netns: str) -> dict[str, int]:
    """``COUNTERS`` of the pod's network namespace (``/proc/net/snmp`` and ``netstat``:
    pairs of a header line of names and a line of values, each prefixed ``Ip:``, ...)."""
    argv = ["ip", "netns", "exec", netns, "cat", "/proc/net/snmp", "/proc/net/netstat"]
    with trio.fail_after(10):
        out = await trio.run_process(argv, capture_stdout=True)
    lines = out.stdout.decode().splitlines()
    values: dict[str, int] = {}
    for names, numbers in zip(lines[::2], lines[1::2], strict=False):
        prefix = names.split(":")[0]
        for name, number in zip(names.split()[1:], numbers.split()[1:], strict=False):
            values[prefix + name] = int(number)
    return {name: values.get(name, 0) for name in COUNTERS}


def write_hosts(lab: Lab, names: dict[int, str]) -> None:
    """``/etc/netns/<pod netns>/hosts`` for every pod: localhost and every rank by name."""
    text = "127.0.0.1\tlocalhost\n" + "".join(
        f"{pod.underlay_ip}\t{names[pod.index]}\n" for pod in lab.pods
    )
    for pod in lab.pods:
        folder = NETNS_ETC / pod.netns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(text)


def remove_hosts(lab: Lab) -> None:
    for pod in lab.pods:
        if pod.netns.startswith(f"vlab-{lab.id}-"):
            shutil.rmtree(NETNS_ETC / pod.netns, ignore_errors=True)


async def launcher_side(lab: Lab, size: int, order: list[int], gaps: list[float]) -> JSON:
    names = {r: f"lab-{r}" for r in range(size)}
    placeholders: dict[int, LabProcess] = {}
    apps: dict[int, LabProcess] = {}

    async def create(rank: int) -> None:
        argv = ["sleep", "600"]
        placeholders[rank] = await lab.start(lab.pods[rank], argv, private_mount=False)

    async def restart(rank: int) -> None:
        await placeholders[rank].stop()
        if rank == 0:
            argv = [sys.executable, str(HELLO), "serve", "--port", str(HELLO_PORT)]
        else:
            argv = [sys.executable, str(HELLO), "connect", "--host", names[0],
                    "--port", str(HELLO_PORT), "--rank", str(rank),
                    "--retry", str(RETRY)]  # fmt: skip
        apps[rank] = await lab.start(lab.pods[rank], argv, private_mount=False)

    try:
        created = await create_pods(order, gaps, create)
        first, last = min(created.values()), max(created.values())
        hosts_started = time.monotonic()
        await trio.to_thread.run_sync(write_hosts, lab, names)
        hosts_written = time.monotonic()
        async with trio.open_nursery() as nursery:
            for rank in order:
                nursery.start_soon(restart, rank)
        restarted = time.monotonic()
        workers = set(range(1, size))
        await wait_for(lambda: set(hellos(apps[0])) >= workers, "launcher: every hello",
                       SIDE_TIMEOUT, 0.1)  # fmt: skip
        done = max(hellos(apps[0]).values())
        retried = sum(1 for p in apps.values() if '"failed"' in p.log_text())
    finally:
        await stop_all([*apps.values(), *placeholders.values()])
        remove_hosts(lab)
    return {
        "from_first_pod": done - first,
        "from_last_pod": done - last,
        "hosts_s": hosts_written - hosts_started,
        "restart_s": restarted - hosts_written,
        "workers_retried": retried,
    }


async def one_run(size: int, rng: Any, max_gap: float, launcher_first: bool) -> JSON:  # noqa: ANN401
    order = list(range(size))
    rng.shuffle(order)
    gaps = [rng.uniform(0, max_gap) for _ in order]
    async with open_lab(size, static_neighbours=True) as lab:
        sampler = LoadSampler(own_netns=lab_netns(lab))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            sides: JSON = {}
            for side in ("launcher", "vnetd") if launcher_first else ("vnetd", "launcher"):
                run_side = launcher_side if side == "launcher" else vnetd_side
                sides[side] = await run_side(lab, size, order, gaps)
                await trio.sleep(2.0)
            nursery.cancel_scope.cancel()
    result = {
        "size": size,
        "order": order,
        "launcher_first": launcher_first,
        **sides,
        "ratio_from_last_pod": sides["launcher"]["from_last_pod"] / sides["vnetd"]["from_last_pod"],
        "ratio_from_first_pod": sides["launcher"]["from_first_pod"]
        / sides["vnetd"]["from_first_pod"],
        "load": sampler.summary(),
    }
    print(
        f"  size {size}: all connected {sides['vnetd']['from_last_pod']:.2f} s (vnetd) vs "
        f"{sides['launcher']['from_last_pod']:.2f} s (launcher) after the last pod; ratio "
        f"{result['ratio_from_last_pod']:.1f}x ({result['ratio_from_first_pod']:.2f}x from the "
        f"first pod); {sides['launcher']['workers_retried']} workers retried; vnetd: last ready "
        f"{sides['vnetd']['last_ready_after_last_pod']:.2f} s after the last pod, ready → hello "
        f"p50 {sides['vnetd']['ready_to_hello']['p50']:.2f} max "
        f"{sides['vnetd']['ready_to_hello']['max']:.2f} s; workers whose SYN was sent again: "
        f"{sides['vnetd']['syn_resent_workers']} (rank 0's answers with no route: "
        f"{sides['vnetd']['rank0_no_route']}); the last pod's daemon: ready "
        f"{sides['vnetd']['last_start_to_ready']:.2f} s after its start, with "
        f"{sides['vnetd']['last_daemon_cpu_s']:.2f} s of its own CPU, the cores "
        f"{sides['vnetd']['last_start_cores_busy']:.0%} busy meanwhile",
        flush=True,
    )
    return result


def figures(size: int, mine: list[JSON]) -> JSON:
    """One size's row of the summary, from its runs."""
    return {
        **{
            f"{side}_{key}": spread(r[side][key] for r in mine)
            for side in ("vnetd", "launcher")
            for key in ("from_last_pod", "from_first_pod")
        },
        **spreads(mine, "ratio_from_last_pod", "ratio_from_first_pod"),
        "launcher_restart_s": spread(r["launcher"]["restart_s"] for r in mine),
        "vnetd_last_ready_after_last_pod": spread(
            r["vnetd"]["last_ready_after_last_pod"] for r in mine
        ),
        "vnetd_start_to_ready_p50": spread(r["vnetd"]["start_to_ready"]["p50"] for r in mine),
        "vnetd_ready_to_hello_p50": spread(r["vnetd"]["ready_to_hello"]["p50"] for r in mine),
        "vnetd_ready_to_hello_max": spread(r["vnetd"]["ready_to_hello"]["max"] for r in mine),
        "vnetd_syn_resent_workers": spread(r["vnetd"]["syn_resent_workers"] for r in mine),
        "launcher_workers_retried": spread(r["launcher"]["workers_retried"] for r in mine),
    }


def summarize(runs: list[JSON], sizes: list[int]) -> JSON:
    return {"by_size": summary_by_size(runs, sizes, figures), "target_ratio": 10}


async def main_async(args: Any) -> int:  # noqa: ANN401
    seed, rng = seeded(args.seed)
    runs, failures = await run_each_size(
        "launcher", args.sizes, args.runs,
        lambda size, i: one_run(size, rng, args.max_gap, launcher_first=i % 2 == 1),
    )  # fmt: skip
    params = {"sizes": args.sizes, "runs": {size: runs_for(args.runs, size) for size in args.sizes},
              "seed": seed, "max_gap_s": args.max_gap,
              "retry_s": RETRY, "lease_ttl_s": 5}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs, args.sizes),
                 merge_load([r["load"] for r in runs]), args.out,
                 failures)  # fmt: skip
    return len(failures)


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], sizes=(8, 32, 64), runs=3)
    parser.add_argument("--max-gap", type=float, default=1.0, help="creation gaps 0..S (1)")
    args = parser.parse_args()
    check_host()
    try:
        import zmq  # noqa: F401
    except ImportError:
        sys.exit("bench: pyzmq is missing; install the test extra (scripts/setup)")
    sys.exit(1 if trio.run(main_async, args) else 0)


if __name__ == "__main__":
    main()
