"""The bench page's target table: each figure of issue 16's table, before, target, now.

Kept apart from ``report.py``, which imports it; it reads the same result files.
A figure is judged on its worst run where the target says "every run", else on
the pooled figure. "Before" is the figure the issue was filed with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from common import JSON


@dataclass(frozen=True)
class Target:
    figure: str
    before: str
    limit: float
    unit: str
    measure: Callable[[dict[str, JSON]], float | None]
    """The figure from the results (``None``: not measured)."""


def _get(results: dict[str, JSON], name: str, *path: str) -> float | None:
    node: object = results.get(name)
    if node is not None:
        node = node["summary"]  # type: ignore[index]
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def slowest_pair_after_both_ready(results: dict[str, JSON], size: int = 64) -> float | None:
    """The slowest ordered pair of the ``size``-pod formation runs, counted from the
    moment both its ends were ready (their claims), over every run."""
    r = results.get("full_mesh")
    if r is None:
        return None
    worst: float | None = None
    for run in r["runs"]:
        if run.get("size") != size or "pairs" not in run:
            continue
        ready = {int(k): v for k, v in run["ready"].items()}
        for pair, t in run["pairs"].items():
            a, b = (int(x) for x in pair.split(">"))
            after = t - max(ready[a], ready[b])
            worst = after if worst is None else max(worst, after)
    return worst


TARGETS = (
    Target("8 pods, launcher bench: all connected to rank 0 after the last pod, every run",
           "2.93 and 4.23 s", 0.8, "s",
           lambda r: _get(r, "launcher", "by_size", "8", "vnetd_from_last_pod", "max")),
    Target("64 pods: full mesh after the last ready, every run", "11.7 s (8.6–14.7)", 2.0, "s",
           lambda r: _get(r, "full_mesh", "by_size", "64", "from_last_ready", "max")),
    Target("64 pods: full mesh after the last start, every run", "18.7 s; 51.8 s", 5.0, "s",
           lambda r: _get(r, "full_mesh", "by_size", "64", "from_last_start", "max")),
    Target("slowest pair after both ends ready, 64 pods", "7–13 s", 1.5, "s",
           slowest_pair_after_both_ready),
    Target("rank 0 last, every pair sending at once from the last start: all answered, "
           "24 pods, every run", "3.8 and 15.1 s", 2.0, "s",
           lambda r: _get(r, "all_to_all", "by_size", "24", "from_last_start", "max")),
    Target("1024 simulated ranks, 2 cores: converged after the last registration",
           "never (341 s window)", 60.0, "s",
           lambda r: _converged(r, 1024)),
    Target("per-daemon CPU to take 1023 joins (1024 simulated ranks)", "0.52 s", 0.1, "s",
           lambda r: _get(r, "control_plane", "by_size", "1024", "cpu_s_per_daemon_to_full",
                          "median")),
    Target("etcd CPU per delivered member event during a storm (1024 simulated ranks)",
           "≈ 100–150 µs", 30.0, "µs",
           lambda r: _get(r, "control_plane", "by_size", "1024", "etcd_us_per_event", "median")),
    Target("etcd CPU per delivered member event, watch delivery alone, batched through the "
           "JSON gateway (64 watchers)", "≈ 35 µs", 30.0, "µs",
           lambda r: _get(r, "etcd_transport", "json_batched", "etcd_us_per_event", "median")),
    Target("steady propagation at 8 pods, p50 (pooled)", "33 ms", 20.0, "ms",
           lambda r: _get(r, "propagation", "by_size", "8", "steady", "p50")),
    Target("steady propagation at 64 pods, p99 (pooled)", "306 ms; 747 ms", 150.0, "ms",
           lambda r: _get(r, "propagation", "by_size", "64", "steady", "p99")),
    Target("`vnetd up` start → address on the interface, every start", "0.67–0.86 s", 0.35, "s",
           lambda r: _get(r, "startup", "all", "address_s", "max")),
    Target("one daemon RSS at 1023 peers", "63.5 MiB", 55.0, "MiB",
           lambda r: _get(r, "footprint", "steps", "1023", "vnetd_rss_mib", "max")),
    Target("one change at 1023 peers: the daemon's whole pass (median)", "41 ms; 86 ms", 2.0, "ms",
           lambda r: _get(r, "dataplane", "vnetd_pass_ms", "median")),
    Target("idle CPU right after 1023 joins (share of a core)", "2.2 %", 0.5, "%",
           lambda r: _scaled(_get(r, "footprint", "idle_vnetd_share", "max"), 100)),
)  # fmt: skip


def _converged(results: dict[str, JSON], size: int) -> float | None:
    """The slowest run's time to full mesh; ``inf`` when a run of ``size`` never got there."""
    runs = _get(results, "control_plane", "by_size", str(size), "runs")
    if not runs:
        return None
    if (_get(results, "control_plane", "by_size", str(size), "converged") or 0) < runs:
        return math.inf
    return _get(results, "control_plane", "by_size", str(size), "converge_s", "max")


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _shown(value: float | None, unit: str) -> str:
    if value is None:
        return "not measured"
    if math.isinf(value):
        return "did not converge in the window"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def target_rows(results: dict[str, JSON]) -> list[tuple[list[str], bool | None]]:
    """One row per target: figure, before, target, now; and whether it is met."""
    rows = []
    for t in TARGETS:
        now = t.measure(results)
        met = None if now is None else now <= t.limit
        rows.append(([t.figure, t.before, f"≤ {t.limit:g} {t.unit}", _shown(now, t.unit)], met))
    return rows
