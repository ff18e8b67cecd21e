#!/usr/bin/env python3
"""Watch fan-out: one formation of N ranks against W member watchers, each watcher on etcd
directly, through etcd's grpc-proxy, or through a vnetd relay, arms in one run.

    watch_fanout.py [--size 1024] [--watchers 256] [--runs 1] [--rest 5] [--arms ...]

One lab of two pods and etcd (3.4, its own namespace), etcd pinned to core 1
(``taskset``) and everything of the bench on core 0: the watchers and the
registering process (pod 0), the cache (pod 1), and this script; whatever else
runs on the machine is not pinned (the load record says how busy it was). Each
arm runs on a fresh members prefix:

* ``writes``: no watcher; the N registrations alone (etcd's cost per write,
  taken off the others' per-event figure);
* ``claims``: no watcher; N claims as daemons make them, each a lease grant and a
  create transaction under that lease (etcd's cost per claim, the scale model's);
* ``direct-json``: W watchers on etcd through its JSON gateway
  (``EtcdRegistry.watch``: the daemon's read path today);
* ``direct-grpc``: W gRPC watchers on etcd (grpcio, bench/etcd_transport_client.py);
* ``direct-vnetd-grpc``: W watchers on etcd through the daemon's own gRPC watch
  (``GrpcWatchRegistry``: a worker thread per stream under trio);
* ``proxy``: the same W gRPC watchers on ``etcd grpc-proxy start`` in pod 1;
* ``proxy-vnetd-grpc``: W daemon gRPC watches on that grpc-proxy
  (``[registry] watch_endpoints``);
* ``relay``: W JSON watchers on ``vnetd relay`` in pod 1 (``RELAY_ARGV``); until
  ``vnetd relay --help`` answers, one printed line and no figures.

Per arm (bench/fanout_client.py): the W watches open and confirmed from the
next revision, then etcd's and the cache's CPU at rest (over ``--rest`` s in a
first run; in a later one over as long as the arm's storm window lasted before,
up to ``REST_MAX`` s), then N member records put at once (32 requests in flight) while the
watches deliver. Figures: the events etcd delivered (its
``etcd_debugging_mvcc_events_total``) and the watch messages it sent; the
watches etcd held (``etcd_debugging_mvcc_watcher_total``); etcd's CPU over the
storm window (registration → every watcher holding all N) less its at-rest
rate over the same length, and per delivered event with the writes' own cost
taken off; the cache's CPU the same way and per record it forwarded (W × N);
the watchers' CPU; and the time from the first registration until every
watcher held all N.

grpc-proxy coalesces watchers (etcd v3.4 proxy/grpcproxy/watch_broadcast*.go)
that watch the same key range and are not behind: a watcher joins a running
broadcast only if the revision it wants next is not older than the broadcast's
(else it gets a broadcast, and an etcd watch, of its own, merged later when it
has caught up and its broadcast has fewer than 5 receivers); it serves gRPC
only, answers no progress request, and every broadcast asks etcd for
prev_kv and progress notifications. The W watchers here open on one range from
one revision, so they share one etcd watch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import trio
from common import (
    BENCH,
    JSON,
    LoadSampler,
    attempt,
    base_parser,
    check_host,
    proc_cpu_seconds,
    runs_for,
    spread,
    write_result,
)
from etcd_metrics import parse as parse_metrics
from etcd_transport import signal_go

from vnetd.control.membership import members_prefix
from vnetd.lab.etcd import ETCD_BIN
from vnetd.lab.open_lab import Lab, LabProcess, open_lab
from vnetd.spec import parse_spec

NAME = "watch_fanout"
TITLE = "Watch fan-out: etcd directly, through grpc-proxy, through a vnetd relay"
CLIENT = str(BENCH / "fanout_client.py")
ARMS = ("writes", "claims", "direct-json", "direct-grpc", "direct-vnetd-grpc", "proxy",
        "proxy-vnetd-grpc", "relay")  # fmt: skip
CLIENT_TRANSPORT = {"direct-json": "json", "relay": "json", "direct-vnetd-grpc": "vnetd-grpc",
                    "proxy-vnetd-grpc": "vnetd-grpc"}  # fmt: skip
"""Each arm's ``fanout_client.py --transport`` (the others: grpc)."""
PROXY_ARMS = ("proxy", "proxy-vnetd-grpc")
WRITE_ARMS = ("writes", "claims")
"""The arms with no watcher: the registrations' own cost (``claims``: each a lease grant
and a create transaction under it, as a daemon's claim is; ``writes``: one put each)."""
CACHE_PORT = 23790
ETCD_CORE, BENCH_CORE = 1, 0
READY_TIMEOUT = 60.0
REST_MAX = 60.0
RELAY_ARGV = (sys.executable, "-m", "vnetd", "relay", "--config", "{config}", "--etcd", "{etcd}",
              "--listen", "{listen}")  # fmt: skip
"""How the relay arm starts ``vnetd relay`` (``{config}``: the arm's mesh spec, whose
members prefix the relay serves; ``{etcd}``: etcd's URL; ``{listen}``: HOST:PORT);
``--relay-argv`` overrides it (``env PYTHONPATH=... python -m vnetd relay ...`` runs a
relay from another checkout)."""
SCRAPE = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
)


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], sizes=[1024], runs=1)
    parser.add_argument("--size", type=int, default=1024, help="ranks registering at once")
    parser.add_argument("--watchers", type=int, default=256, help="member watchers (W)")
    parser.add_argument("--rest", type=float, default=5.0, help="at-rest window before, s")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    parser.add_argument("--relay-argv", help="the relay's command line (see RELAY_ARGV)")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on one storm, s")
    args = parser.parse_args()
    args.arms = [a for a in args.arms.split(",") if a]
    if unknown := set(args.arms) - set(ARMS):
        parser.error(f"--arms: unknown {', '.join(sorted(unknown))}")
    return args


def relay_command(args: argparse.Namespace) -> list[str] | None:
    """``vnetd relay``'s argv template, or None while no such command exists here."""
    if args.relay_argv:
        return args.relay_argv.split()
    probe = subprocess.run([sys.executable, "-m", "vnetd", "relay", "--help"],
                           capture_output=True, timeout=30, check=False)  # fmt: skip
    return list(RELAY_ARGV) if probe.returncode == 0 else None


def pinned(argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(BENCH_CORE), *argv]


async def wait_line(process: LabProcess, text: str, timeout: float) -> str:  # noqa: ASYNC109
    """The first line of ``process``'s log that starts with ``text``."""
    with trio.fail_after(timeout):
        while True:
            for line in process.log_text().splitlines():
                if line.startswith(text):
                    return line
            if process.returncode is not None:
                raise RuntimeError(f"{' '.join(process.argv[-12:-8])} exited: "
                                   f"{process.log_text()[-800:]}")  # fmt: skip
            await trio.sleep(0.02)


async def scrape(lab: Lab, url: str) -> str:
    """``url``'s text, fetched from pod 0 (etcd and the caches are reached only there)."""
    result = await lab.run(lab.pods[0], [sys.executable, "-c", SCRAPE, url], timeout=15)
    if result.returncode != 0:
        raise RuntimeError(f"{url}: {result.stderr.decode(errors='replace')[-300:]}")
    return result.stdout.decode()


async def etcd_metrics(lab: Lab) -> JSON:
    return parse_metrics(await scrape(lab, f"{lab.etcd_url}/metrics"))


class Cache:
    """A cache between etcd and the watchers, running in pod 1 on the bench's core."""

    def __init__(self, process: LabProcess, url: str) -> None:
        self.process, self.url = process, url

    @property
    def cpu(self) -> float:
        return task_cpu_seconds(self.process.pid)


async def wait_answers(lab: Lab, url: str, process: LabProcess) -> None:
    """Until ``url`` answers from pod 0 (bounded by ``READY_TIMEOUT``)."""
    with trio.fail_after(READY_TIMEOUT):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{process.argv[0]} exited: {process.log_text()[-600:]}")
            try:
                await scrape(lab, url)
                return
            except RuntimeError:
                await trio.sleep(0.2)


async def start_proxy(lab: Lab) -> Cache:
    pod = lab.pods[1]
    listen = f"{pod.underlay_ip}:{CACHE_PORT}"
    argv = [ETCD_BIN, "grpc-proxy", "start", "--endpoints", lab.etcd_url.removeprefix("http://"),
            "--listen-addr", listen, "--advertise-client-url", listen,
            "--data-dir", str(pod.state_dir / "proxy")]  # fmt: skip
    process = await lab.start(pod, pinned(argv), private_mount=False)
    metrics = f"http://{listen}/metrics"
    await wait_answers(lab, metrics, process)
    return Cache(process, f"http://{listen}")


async def start_relay(lab: Lab, template: list[str], config: Path) -> Cache:
    """``vnetd relay`` for the mesh of ``config``, once its /healthz says it is in step."""
    pod = lab.pods[1]
    listen = f"{pod.underlay_ip}:{CACHE_PORT + 1}"
    argv = [part.format(config=config, etcd=lab.etcd_url, listen=listen) for part in template]
    process = await lab.start(pod, pinned(argv), private_mount=False)
    url = f"http://{listen}"
    await wait_answers(lab, f"{url}/healthz", process)
    return Cache(process, url)


def arm_spec(lab: Lab, name: str, size: int) -> tuple[Path, str]:
    """A mesh spec of the arm's own (its file, its members prefix): each arm registers
    on a fresh prefix, and a relay serves one mesh's."""
    mesh = {"name": name, "size": size, "network": "10.64.0.0/12"}
    path = lab.workdir / f"{name}.toml"
    path.write_text("[mesh]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in mesh.items()))
    return path, members_prefix(parse_spec({"mesh": mesh}))


def task_cpu_seconds(pid: int) -> float:
    """The CPU time of ``pid``'s threads, to the nanosecond (``/proc/PID/task/*/schedstat``;
    /proc's utime + stime come in 10 ms ticks, as large as a small storm's cost). Threads
    that exited no longer count: Go's rarely do, and the figures are differences."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9 if total else proc_cpu_seconds(pid)


def etcd_cpu(lab: Lab) -> float:
    assert lab.etcd is not None
    return task_cpu_seconds(lab.etcd.pid)


class Arm:
    """One arm of one run: W watchers (or none) on a fresh prefix, then the N writes."""

    def __init__(self, lab: Lab, args: argparse.Namespace, name: str, run: int,
                 cache: Cache | None, rest_s: float) -> None:  # fmt: skip
        self.lab, self.args, self.name, self.run, self.cache = lab, args, name, run, cache
        self.rest_s = rest_s
        self.config, self.prefix = arm_spec(lab, f"fanout-{run}-{name}", args.size)

    def client_argv(self) -> list[str]:
        url = self.cache.url if self.cache is not None else self.lab.etcd_url
        transport = CLIENT_TRANSPORT.get(self.name, "grpc")
        go = self.lab.workdir / f"go-{self.run}-{self.name}"
        where = ["--url", url]
        if transport == "vnetd-grpc":  # its lists and writes on etcd, its watch on the cache
            where = ["--url", self.lab.etcd_url, "--watch-url", url]
        return pinned([sys.executable, CLIENT, "watch", *where, "--prefix", self.prefix,
                       "--transport", transport, "--watchers", str(self.args.watchers),
                       "--count", str(self.args.size), "--go", str(go)])  # fmt: skip

    async def open_watches(self) -> LabProcess | None:
        if self.name in WRITE_ARMS:
            return None
        client = await self.lab.start(self.lab.pods[0], self.client_argv(), private_mount=False)
        await wait_line(client, "connected", READY_TIMEOUT)
        signal_go(self.lab.workdir / f"go-{self.run}-{self.name}",
                  await self.lab.etcd_revision() + 1)  # fmt: skip
        await wait_line(client, "ready", READY_TIMEOUT)
        await trio.sleep(1.0)
        return client

    async def delivered(self, client: LabProcess | None) -> JSON:
        """The watch client's result line (none for the writes arm)."""
        if client is None:
            return {}
        result: JSON = json.loads(await wait_line(client, "{", self.args.timeout))
        return result

    def cpus(self) -> tuple[float, float, float]:
        cache = self.cache.cpu if self.cache is not None else 0.0
        return time.monotonic(), etcd_cpu(self.lab), cache

    async def measure(self) -> JSON:
        if self.name != "relay":
            return await self.storm()
        self.cache = await start_relay(self.lab, self.args.relay_template, self.config)
        try:
            return await self.storm()
        finally:
            await self.cache.process.stop()

    async def storm(self) -> JSON:
        client = await self.open_watches()
        try:
            t0, etcd0, cache0 = self.cpus()
            await trio.sleep(self.rest_s)
            t1, etcd1, cache1 = self.cpus()
            before = await etcd_metrics(self.lab)
            tb, etcd_b, cache_b = self.cpus()
            argv = pinned([sys.executable, CLIENT, "register", "--url", self.lab.etcd_url,
                           "--prefix", self.prefix, "--count", str(self.args.size),
                           *(["--claims"] if self.name == "claims" else [])])  # fmt: skip
            writer = await self.lab.start(self.lab.pods[0], argv, private_mount=False)
            wrote = json.loads(await wait_line(writer, "{", self.args.timeout))
            got = await self.delivered(client)
            ta, etcd_a, cache_a = self.cpus()
            after = await etcd_metrics(self.lab)
        finally:
            if client is not None:
                await client.stop()
        window = ta - tb
        rest_etcd = (etcd1 - etcd0) / (t1 - t0)
        rest_cache = (cache1 - cache0) / (t1 - t0)
        end = got.get("done") or wrote["last"]
        delivered = after["mvcc"].get("events", 0) - before["mvcc"].get("events", 0)
        sent = after["sent"].get("Watch", 0) - before["sent"].get("Watch", 0)
        figures: JSON = {
            "arm": self.name,
            "run": self.run + 1,
            "size": self.args.size,
            "watchers": 0 if client is None else self.args.watchers,
            "etcd_watches": before["mvcc"].get("watcher"),
            "etcd_events": delivered,
            "etcd_watch_messages": sent,
            "window_s": round(window, 3),
            "etcd_cpu_s": round(etcd_a - etcd_b - rest_etcd * window, 3),
            "rest_s": round(t1 - t0, 3),
            "etcd_rest_share": round(rest_etcd, 4),
            "cache_cpu_s": round(cache_a - cache_b - rest_cache * window, 3),
            "cache_rest_share": round(rest_cache, 4),
            "watcher_events": got.get("events", 0),
            "watcher_messages": got.get("messages", 0),
            "watcher_cpu_s": round(got.get("delivery_cpu_s", 0.0), 3),
            "register_s": round(wrote["last"] - wrote["first"], 3),
            "formation_s": round(end - wrote["first"], 3),
            "record_bytes": wrote["record_bytes"],
        }
        print(f"  {self.name}: etcd {figures['etcd_events']:.0f} events, "
              f"{figures['etcd_cpu_s']:.2f} CPU-s, cache {figures['cache_cpu_s']:.2f} CPU-s, "
              f"formation {figures['formation_s']:.2f} s", flush=True)  # fmt: skip
        return figures


def per_event(arms: list[JSON]) -> None:
    """etcd's µs per delivered event (the writes' own cost taken off) and the cache's
    µs per forwarded record, added to each arm of one run."""
    writes = next((a["etcd_cpu_s"] for a in arms if a["arm"] == "writes"), None)
    idle = min((a["etcd_watches"] for a in arms if a["etcd_watches"] is not None), default=0)
    for arm in arms:
        if arm["etcd_watches"] is not None:
            arm["etcd_watches"] -= idle  # those of no arm (the proxy's own, say)
        if arm["arm"] in WRITE_ARMS:
            per = "etcd_us_per_write" if arm["arm"] == "writes" else "etcd_us_per_claim"
            arm[per] = round(arm["etcd_cpu_s"] / arm["size"] * 1e6, 1)
            continue
        if writes is not None and arm["etcd_events"] >= EVENTS_FOR_A_FIGURE * arm["size"]:
            arm["etcd_us_per_event"] = round((arm["etcd_cpu_s"] - writes) / arm["etcd_events"]
                                             * 1e6, 1)  # fmt: skip
        forwarded = arm["watchers"] * arm["size"]
        if arm["arm"] in (*PROXY_ARMS, "relay") and forwarded:
            arm["cache_us_per_record"] = round(arm["cache_cpu_s"] / forwarded * 1e6, 2)


EVENTS_FOR_A_FIGURE = 10
"""etcd's µs per event is given where it delivered at least this many events per write:
below, the writes' own cost (taken off, and not the same from arm to arm: it depends on
how fast they go) is most of the figure."""

KEYS = ("etcd_events", "etcd_watch_messages", "etcd_watches", "etcd_cpu_s", "etcd_us_per_event",
        "etcd_us_per_write", "etcd_us_per_claim", "cache_cpu_s", "cache_us_per_record",
        "watcher_cpu_s", "formation_s", "register_s", "window_s", "rest_s",
        "etcd_rest_share")  # fmt: skip


def summarize(runs: list[JSON], arms: list[str]) -> JSON:
    by_arm: JSON = {}
    for name in arms:
        mine = [a for run in runs for a in run["arms"] if a["arm"] == name]
        if mine:
            by_arm[name] = {k: spread(a[k] for a in mine if a.get(k) is not None) for k in KEYS}
            by_arm[name]["runs"] = len(mine)
    ratios: JSON = {}
    for cache in ("proxy", "relay"):
        for direct in ("direct-json", "direct-grpc"):
            a, b = by_arm.get(cache), by_arm.get(direct)
            if a and b and b["etcd_events"]["median"] and b["etcd_cpu_s"]["median"]:
                ratios[f"{cache}/{direct}"] = {
                    "events": round(a["etcd_events"]["median"] / b["etcd_events"]["median"], 4),
                    "etcd_cpu": round(a["etcd_cpu_s"]["median"] / b["etcd_cpu_s"]["median"], 4),
                }
    return {"by_arm": by_arm, "ratios": ratios, "target_events_ratio": 0.1,
            "target_etcd_cpu_ratio": 0.2}  # fmt: skip


async def bench(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, {BENCH_CORE})
    template = args.relay_template = relay_command(args) if "relay" in args.arms else None
    if "relay" in args.arms and template is None:
        print("relay arm skipped: no `vnetd relay` command here yet", flush=True)
        args.arms.remove("relay")
    runs: list[JSON] = []
    failures: list[JSON] = []
    async with open_lab(2) as lab, trio.open_nursery() as nursery:
        sampler = LoadSampler(own_netns=set(lab.netns_names))
        nursery.start_soon(sampler.run)
        assert lab.etcd is not None
        await trio.run_process(["taskset", "-a", "-p", "-c", str(ETCD_CORE), str(lab.etcd.pid)],
                               capture_stdout=True)  # fmt: skip
        caches: dict[str, Cache] = {}
        windows: dict[str, float] = {}  # each arm's last storm window: the next rest's length
        if any(name in args.arms for name in PROXY_ARMS):
            proxy = await start_proxy(lab)
            caches.update((name, proxy) for name in PROXY_ARMS)
        for index in range(runs_for(args.runs)):
            print(f"{NAME}: {args.size} ranks, {args.watchers} watchers, run {index + 1}",
                  flush=True)  # fmt: skip
            arms = []
            for name in args.arms:
                rest = min(max(args.rest, windows.get(name, 0.0)), REST_MAX)
                arm = Arm(lab, args, name, index, caches.get(name), rest)
                done = await attempt(failures, {"arm": name, "run": index + 1}, arm.measure)
                if done is not None:
                    arms.append(done)
                    windows[name] = done["window_s"]
            per_event(arms)
            runs.append({"run": index + 1, "arms": arms})
        for cache in {id(c): c for c in caches.values()}.values():
            await cache.process.stop()
        nursery.cancel_scope.cancel()
    params = {"size": args.size, "watchers": args.watchers, "rest_s": args.rest,
              "arms": args.arms, "etcd_core": ETCD_CORE, "bench_core": BENCH_CORE,
              "relay_argv": template, "cores": os.cpu_count()}  # fmt: skip
    write_result(NAME, TITLE, params, runs, summarize(runs, args.arms), sampler.summary(),
                 args.out, failures)  # fmt: skip
    return len(failures)


def main() -> None:
    check_host(("ip", "unshare", "nsenter", "etcd", "taskset"))
    sys.exit(1 if trio.run(bench, parse_args()) else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
