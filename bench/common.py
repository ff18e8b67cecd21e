"""Shared parts of the benchmarks: statistics, result files, machine facts, logs, /proc.

Every bench script writes ``bench/results/<name>.json``::

    {"name", "title", "date", "machine": {...}, "params": {...},
     "load": {...}, "runs": [...], "summary": {...}}

``runs`` holds the raw measurements of each repetition; ``summary`` what
``bench/report.py`` turns into tables and plots. Times inside one run are
either ``time.monotonic()`` (the lab's probes) or wall-clock epoch seconds
(the daemons' JSON logs); ``ClockMap`` converts between the two.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import trio

from vnetd.lab.cluster import MeshLab, write_spec
from vnetd.lab.open_lab import NETNS_PREFIX, Lab, LabProcess
from vnetd.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

JSON = dict[str, Any]


# --- statistics -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Iterable[float]) -> JSON:
    """min / median / max (and n) of repeated measurements; NaN-free."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {
        "n": len(kept),
        "min": min(kept),
        "median": percentile(kept, 50),
        "max": max(kept),
    }


def latency(values: Sequence[float]) -> JSON:
    """n, p50, p90, p99 and max of a sample of latencies."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
    }


def spreads(runs: Sequence[JSON], *names: str) -> JSON:
    """The ``spread`` of each named figure over ``runs``, by name."""
    return {name: spread(r[name] for r in runs) for name in names}


def summary_by_size(
    runs: Sequence[JSON], sizes: Iterable[int], figures: Callable[[int, list[JSON]], JSON]
) -> JSON:
    """A summary's ``by_size`` table: each size's number of runs, then ``figures(size, runs)``."""
    table: JSON = {}
    for size in sizes:
        mine = [r for r in runs if r["size"] == size]
        table[str(size)] = {"runs": len(mine), **figures(size, mine)}
    return table


# --- result files -----------------------------------------------------------------------


def write_result(
    name: str,
    title: str,
    params: JSON,
    runs: list[JSON],
    summary: JSON,
    load: JSON,
    out_dir: Path = RESULTS,
    failures: Sequence[JSON] = (),
) -> Path:
    """Write ``<out_dir>/<name>.json`` (atomically) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "title": title,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "params": params,
        "load": load,
        "runs": runs,
        "failures": list(failures),
        "summary": summary,
    }
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {value!r}")


async def attempt(
    failures: list[JSON],
    what: JSON,
    run: Callable[[], Awaitable[JSON]],
) -> JSON | None:
    """``await run()``; a run that fails (a bound passed, a process misbehaved) is
    recorded in ``failures`` with ``what`` and its error, and the bench goes on.

    Cancellation and KeyboardInterrupt are not caught.
    """
    try:
        return await run()
    except Exception as exc:  # noqa: BLE001 - recorded in the result, the bench goes on
        error = exc
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]  # type: ignore[assignment]
        text = f"{type(error).__name__}: {error}"[:600]
        print(f"  run failed: {text}", flush=True)
        failures.append({**what, "error": text})
        return None


async def run_repeated(
    label: str, n: int, one: Callable[[int], Awaitable[JSON]], what: JSON | None = None
) -> tuple[list[JSON], list[JSON]]:
    """``await one(i)`` for run number ``i`` = 0..n-1, with a progress line each;
    returns the results and the failed runs (``what`` plus the run; see ``attempt``)."""
    results: list[JSON] = []
    failures: list[JSON] = []
    for i in range(n):
        print(f"{label}: run {i + 1}/{n}", flush=True)
        result = await attempt(failures, {**(what or {}), "run": i + 1}, partial(one, i))
        if result is not None:
            results.append(result)
    return results, failures


async def run_each_size(
    label: str,
    sizes: Sequence[int],
    runs: dict[int, int] | int,
    one: Callable[[int, int], Awaitable[JSON]],
) -> tuple[list[JSON], list[JSON]]:
    """``run_repeated`` for every size: ``await one(size, i)``."""
    results: list[JSON] = []
    failures: list[JSON] = []
    for size in sizes:
        done, failed = await run_repeated(
            f"{label}: size {size}", runs_for(runs, size), partial(one, size), {"size": size}
        )
        results += done
        failures += failed
    return results, failures


def read_result(name: str, out_dir: Path = RESULTS) -> JSON | None:
    path = out_dir / f"{name}.json"
    if not path.exists():
        return None
    data: JSON = json.loads(path.read_text())
    return data


# --- the machine ------------------------------------------------------------------------


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return math.nan


def git_commit() -> str:
    """``git rev-parse HEAD`` (read-only), with ``+dirty`` when the tree has changes."""
    head = _first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    try:
        status = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        status = ""
    return head + ("+dirty" if status.strip() else "")


def machine_info() -> JSON:
    """CPU, cores, memory, kernel, Python, wireguard-go, etcd and iperf3 versions, commit."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "os": _first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": platform.python_version(),
        "wireguard_go": _first_line(["wireguard-go", "--version"]),
        "etcd": _first_line(["etcd", "--version"]),
        "iperf3": _first_line(["iperf3", "--version"]),
        "commit": git_commit(),
    }


# --- load on the machine while a bench runs ---------------------------------------------


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return total - idle, total


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def foreign_labs(own: Iterable[str] = ()) -> int:
    """How many lab namespaces exist that are not ours (other people's lab tests)."""
    mine = set(own)
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return 0
    return sum(1 for n in names if n.startswith(NETNS_PREFIX) and n not in mine)


@dataclass
class LoadSampler:
    """Samples machine CPU use and other labs' namespaces every ``interval`` s."""

    interval: float = 1.0
    own_netns: set[str] = field(default_factory=set)
    busy: list[float] = field(default_factory=list)
    foreign: list[int] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)

    async def run(self) -> None:
        before = cpu_jiffies()
        while True:
            await trio.sleep(self.interval)
            now = cpu_jiffies()
            total = now[1] - before[1]
            if total > 0:
                self.busy.append((now[0] - before[0]) / total)
            before = now
            self.foreign.append(foreign_labs(self.own_netns))
            self.loadavg.append(_loadavg())

    def summary(self) -> JSON:
        return {
            "cpu_busy_mean": sum(self.busy) / len(self.busy) if self.busy else None,
            "cpu_busy_max": max(self.busy, default=None),
            "loadavg_max": max(self.loadavg, default=None),
            "foreign_lab_netns_max": max(self.foreign, default=0),
            "samples": len(self.busy),
        }


def merge_load(parts: Sequence[JSON]) -> JSON:
    """One load record for a whole script from the records of its runs."""
    busy = [p["cpu_busy_mean"] for p in parts if p.get("cpu_busy_mean") is not None]
    return {
        "cpu_busy_mean": sum(busy) / len(busy) if busy else None,
        "cpu_busy_max": max((p.get("cpu_busy_max") or 0 for p in parts), default=None),
        "loadavg_max": max((p.get("loadavg_max") or 0 for p in parts), default=None),
        "foreign_lab_netns_max": max((p.get("foreign_lab_netns_max") or 0 for p in parts),
                                     default=0),
    }  # fmt: skip


def quiet_check() -> str | None:
    """Why the machine is not quiet (other labs, wireguard-go), or None."""
    labs = foreign_labs()
    wg = _first_line(["pgrep", "-c", "wireguard-go"])
    busy = []
    if labs:
        busy.append(f"{labs} lab namespaces of others")
    if wg.isdigit() and int(wg) > 0:
        busy.append(f"{wg} wireguard-go processes")
    return ", ".join(busy) or None


# --- /proc ------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (NaN when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _proc_kib(path: str, field: str) -> int:
    """The KiB figure a ``/proc`` file gives on its ``field`` line (0 when the process is gone)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_rss_kib(pid: int) -> int:
    """Resident set size (VmRSS) of ``pid`` in KiB (0 when it is gone)."""
    return _proc_kib(f"/proc/{pid}/status", "VmRSS:")


def proc_pss_kib(pid: int) -> int:
    """Proportional set size of ``pid`` in KiB, shared pages split (0 when gone)."""
    return _proc_kib(f"/proc/{pid}/smaps_rollup", "Pss:")


# --- the daemons' JSON logs -------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    t: float
    """Wall-clock epoch seconds (the JSON ``time`` field, microsecond precision)."""
    message: str
    level: str


def json_log(text: str) -> list[LogLine]:
    """The JSON log lines of ``vnetd --log-format json`` (other lines are skipped)."""
    lines: list[LogLine] = []
    for raw in text.splitlines():
        if not raw.startswith("{"):
            continue
        try:
            record = json.loads(raw)
            when = datetime.fromisoformat(record["time"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        lines.append(LogLine(when, str(record.get("message", "")), str(record.get("level", ""))))
    return lines


@dataclass
class ClockMap:
    """Converts wall-clock epoch seconds to ``time.monotonic()`` on this machine."""

    offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def to_monotonic(self, wall: float) -> float:
        return wall - self.offset

    def to_wall(self, mono: float) -> float:
        return mono + self.offset


class LogFollower:
    """Parses a growing log file incrementally (only complete new lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines: list[LogLine] = []
        self._partial = b""

    def read(self) -> list[LogLine]:
        """All JSON log lines so far."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return self.lines
        self.offset += len(data)
        data = self._partial + data
        complete, _, self._partial = data.rpartition(b"\n")
        if complete:
            self.lines.extend(json_log(complete.decode(errors="replace")))
        return self.lines


@dataclass
class JsonMesh(MeshLab):
    """``MeshLab`` whose daemons log JSON (``vnetd --log-format json up``)."""

    followers: dict[int, LogFollower] = field(default_factory=dict)
    log_level: str = "INFO"
    program: list[str] = field(default_factory=lambda: [sys.executable, "-m", "vnetd"])
    """What runs ``vnetd`` (``startup.py --profile``: ``bench/profile_up.py``)."""

    @classmethod
    def create(cls, lab: Lab, *, ttl: int = 5) -> JsonMesh:
        path = write_spec(lab.workdir / "mesh.toml", len(lab.pods), lab.etcd_url, ttl=ttl)
        return cls(lab, path, load_spec(path))

    async def start_rank(self, rank: int, *extra: str, config: Path | None = None) -> LabProcess:
        pod = self.pod(rank)
        argv = [
            *self.program, "--log-format", "json", "--log-level", self.log_level,
            "up",
            "--config", str(config or self.spec_path),
            "--rank", str(rank),
            "--state-dir", str(pod.state_dir),
            *extra,
        ]  # fmt: skip
        env = {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name}
        self.started_at[rank] = time.monotonic()
        process = await self.lab.start(pod, argv, env)
        self.daemons[rank] = process
        self.followers[rank] = LogFollower(process.log_path)
        return process

    def log(self, rank: int) -> list[LogLine]:
        """The JSON log lines of ``rank``'s current daemon process."""
        return self.followers[rank].read()


def claim_time(lines: Sequence[LogLine], rank: int) -> float | None:
    """When the daemon logged ``claimed rank R`` (etcd had acknowledged the write)."""
    prefix = f"claimed rank {rank} as "
    return next((line.t for line in lines if line.message.startswith(prefix)), None)


def peer_events(lines: Sequence[LogLine]) -> list[tuple[float, str, int]]:
    """``(t, "joined"|"left", rank)`` for each peer line, in log order."""
    found: list[tuple[float, str, int]] = []
    for line in lines:
        msg = line.message
        if msg.startswith("peer joined: rank "):
            found.append((line.t, "joined", int(msg.split()[3])))
        elif msg.startswith("peer left: rank ") and msg.split()[3].isdigit():
            found.append((line.t, "left", int(msg.split()[3])))
    return found


def peers_held(lines: Sequence[LogLine]) -> set[int]:
    """The peer ranks a daemon's log says its device holds now."""
    held: set[int] = set()
    for _t, kind, rank in peer_events(lines):
        if kind == "joined":
            held.add(rank)
        else:
            held.discard(rank)
    return held


def plan_durations_ms(lines: Sequence[LogLine], changes: int | None = None) -> list[float]:
    """The ``plan applied: N change(s) in X ms`` durations (only plans of ``changes``)."""
    found = []
    for line in lines:
        parts = line.message.split()
        if line.message.startswith("plan applied: ") and len(parts) >= 6:
            if changes is None or int(parts[2]) == changes:
                found.append(float(parts[5]))
    return found


# --- running things ---------------------------------------------------------------------


def base_parser(description: str, sizes: Sequence[int], runs: int) -> argparse.ArgumentParser:
    """The options every bench script shares."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--sizes",
        type=_int_list,
        default=list(sizes),
        help=f"comma-separated sizes (default {','.join(map(str, sizes))})",
    )
    parser.add_argument(
        "--runs",
        type=per_size,
        default={0: runs},
        help=f"repetitions: N for every size, or SIZE:N,... such as 8:3,64:2 (default {runs})",
    )
    parser.add_argument("--seed", type=int, help="random seed (default: a random one, recorded)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    return parser


def per_size(text: str) -> dict[int, int]:
    """An option given for every size or per size (``--runs``, control_plane's ``--rest``):
    ``3`` → {0: 3} (every size); ``8:3,64:2`` → {8: 3, 64: 2}. Read with ``runs_for``."""
    try:
        if ":" not in text:
            return {0: int(text)}
        pairs = (item.split(":") for item in text.split(",") if item.strip())
        return {int(size): int(n) for size, n in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or SIZE:N,...") from None


def runs_for(runs: dict[int, int], size: int = 0) -> int:
    """How many runs ``--runs`` asks for at ``size`` (1 when it names other sizes only)."""
    return runs.get(size, runs.get(0, 1))


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"sizes must be positive integers: {text!r}")
    return values


def seeded(seed: int | None) -> tuple[int, random.Random]:
    value = random.randrange(1 << 30) if seed is None else seed
    return value, random.Random(value)


def check_host(tools: Sequence[str] = ("ip", "unshare", "nsenter", "etcd", "wireguard-go")) -> None:
    """Exit with a one-line message when the lab cannot run here."""
    if os.geteuid() != 0:
        sys.exit("bench: needs root (network namespaces)")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        sys.exit(f"bench: missing {', '.join(missing)}; run bench/setup first")


def lab_netns(lab: Lab) -> set[str]:
    return set(lab.netns_names)


async def wait_for(
    condition: Any,  # noqa: ANN401 - any zero-argument callable returning a truth value
    what: str,
    timeout: float,  # noqa: ASYNC109 - a bound the caller states
    poll: float = 0.1,
) -> None:
    """Poll ``condition()`` every ``poll`` s; ``TimeoutError`` naming ``what`` after
    ``timeout`` s."""
    with trio.move_on_after(timeout):
        while not condition():  # noqa: ASYNC110 - it reads files the lab's processes write
            await trio.sleep(poll)
        return
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def fmt_s(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def events(process: LabProcess) -> list[JSON]:
    """The JSON lines (``{...}``) a lab process has written to its log so far: the sim
    processes' and scrapers' events; other lines are skipped."""
    found = []
    for line in process.log_text().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found
