#!/usr/bin/env python3
"""Render ``docs/benchmarks.md`` and ``docs/benchmarks/*.png`` from ``bench/results/*.json``.

    .venv/bin/python bench/report.py [--results DIR] [--doc docs/benchmarks.md]

Needs matplotlib (the ``bench`` extra). A result that is missing gives a
section saying so; nothing is measured here.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import JSON, RESULTS, ROOT, read_result
from report_doctor import doctor_section
from report_targets import target_rows
from report_transport import etcd_transport_section

DOC = ROOT / "docs" / "benchmarks.md"
PLOTS = {"dir": ROOT / "docs" / "benchmarks"}
"""Where the plots go: ``benchmarks/`` beside the document (set by ``render``)."""


# --- formatting -------------------------------------------------------------------------


def num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def mmm(spread: JSON | None, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    """``median (min–max)`` of a spread record; just the value when there is one run."""
    if not spread or spread.get("n", 0) == 0 or spread.get("median") is None:
        return "–"
    med, low, high = (spread[k] * scale for k in ("median", "min", "max"))
    if spread["n"] == 1 or num(low, digits) == num(high, digits):
        return f"{num(med, digits)}{unit}"
    return f"{num(med, digits)}{unit} ({num(low, digits)}–{num(high, digits)})"


def by_size(record: JSON) -> list[tuple[str, JSON]]:
    """A ``by_size`` summary's items, smallest size first."""
    return sorted(record.items(), key=lambda kv: int(kv[0]))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def verdict(ok: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[ok]


def failures_note(result: JSON) -> list[str]:
    """A paragraph listing the runs that failed (they are left out of the tables)."""
    failures = result.get("failures") or []
    if not failures:
        return []
    items = "; ".join(
        ", ".join(f"{k} {v}" for k, v in f.items() if k != "error") + f": {f['error']}"
        for f in failures
    )
    return [f"**{len(failures)} run(s) failed** and are left out of the table: {items}", ""]


def load_note(result: JSON) -> str:
    load = result.get("load", {})
    busy = load.get("cpu_busy_mean")
    foreign = load.get("foreign_lab_netns_max", 0)
    text = f"machine CPU busy {busy:.0%} on average" if busy is not None else "load not recorded"
    if foreign:
        text += (
            f"; **other lab tests ran at the same time** (up to {foreign} foreign lab "
            "namespaces), so these figures are pessimistic"
        )
    else:
        text += "; nothing else ran in a lab meanwhile"
    return text


# --- plots ------------------------------------------------------------------------------


def plot(name: str, draw: Callable[[Any], None], size: tuple[float, float] = (7, 4)) -> str:
    """Draw with matplotlib into ``docs/benchmarks/<name>.png``; the markdown image line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS["dir"].mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=size, dpi=110)
    draw(ax)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOTS["dir"] / f"{name}.png")
    plt.close(fig)
    return f"![{name}](benchmarks/{name}.png)"


def cdf(
    ax: Any,  # noqa: ANN401 - a matplotlib Axes
    values: Sequence[float],
    label: str,
    style: str = "-",
    color: str | None = None,
) -> None:
    ordered = sorted(values)
    if ordered:
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, style, label=label, color=color)


# --- sections ---------------------------------------------------------------------------


def machine_section(results: dict[str, JSON]) -> list[str]:
    any_result = next(iter(results.values()), None)
    if any_result is None:
        return ["No results yet: run `bench/run_all`.", ""]
    m = any_result["machine"]
    dates = sorted(r["date"] for r in results.values())
    rows = [
        ["CPU", f"{m['cpu']}, {m['cores']} cores"],
        ["memory", f"{m['memory_gib']} GiB"],
        ["kernel", f"{m['kernel']} ({m['os']})"],
        ["Python", m["python"]],
        ["wireguard-go", m["wireguard_go"]],
        ["etcd", m["etcd"]],
        ["iperf3", m["iperf3"]],
        ["commit", f"`{m['commit']}`"],
        ["date", f"{dates[0]} to {dates[-1]} (UTC)"],
    ]
    return table(["", "machine"], rows)


def propagation_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 1. Propagation latency", ""]
    if r is None:
        return out + ["Not measured (run `bench/formation.py`).", ""], None
    s = r["summary"]["by_size"]
    rows = []
    for size, v in by_size(s):
        rows.append([
            size, str(v["runs"]),
            mmm(v["steady_p50_runs"]), mmm(v["steady_p99_runs"]),
            f"{num(v['steady']['p50'])} / {num(v['steady']['p99'])} ({v['steady']['n']})",
            f"{num(v['startup']['p50'])} / {num(v['startup']['p99'])} ({v['startup']['n']})",
            f"{mmm(v.get('cpu_ms_until_joined_per_daemon'))} / "
            f"{mmm(v['cpu_ms_per_join_per_daemon'])}",
            num(v["pass_ms"]["p50"]),
        ])  # fmt: skip
    target_size = str(r["summary"]["target_size"])
    met = None
    if target_size in s:
        met = s[target_size]["steady"]["p99"] <= r["summary"]["target_p99_ms"]
    out += [
        "From the commit of a member's registration in etcd to the peer being configured",
        "on each other daemon's device (the daemon's `peer joined` log line, written after",
        "wireguard-go accepted the UAPI `set` and the /32 route is in). **Steady**: a member",
        "joins a full, quiet mesh (registered by a real-time-priority writer that timestamps",
        "etcd's answer). **Start-up**: the joins of the ranks themselves while the mesh",
        "forms, from each rank's own `claimed` log line (loaded machine). Milliseconds;",
        "per-run figures are median (min–max) over runs, pooled ones over all samples.",
        "",
        *table(
            [
                "pods",
                "runs",
                "steady p50",
                "steady p99",
                "steady p50 / p99 pooled (n)",
                "start-up p50 / p99 pooled (n)",
                "daemon CPU per join, ms: until all had it / in 3 s",
                "reconcile pass p50, ms",
            ],
            rows,
        ),  # fmt: skip
    ]
    out.append(
        plot("propagation", lambda ax: _propagation_plot(ax, r))
        + f"\n\nTarget: p99 ≤ {r['summary']['target_p99_ms']:g} ms at 64 pods (steady, pooled) — "
        + verdict(met)
        + f". Load: {load_note(r)}."
    )
    return out + ["", *_propagation_why(r), *failures_note(r)], met


def _propagation_why(r: JSON) -> list[str]:
    """Why the figure grows with N on this machine: every daemon works on every join."""
    cores = r["machine"].get("cores") or 1
    lines = []
    for size, v in by_size(r["summary"]["by_size"]):
        cpu = (v.get("cpu_ms_until_joined_per_daemon") or {}).get("median")
        first = (v.get("first_observer_ms") or {}).get("median")
        if cpu is None or first is None:
            continue
        lines.append(
            f"{size} pods: the first daemon had the peer after {num(first)} ms; each daemon "
            f"spent {num(cpu)} ms of CPU until the last one had it, so {size} daemons on "
            f"{cores} cores need about {num(int(size) * cpu / cores, 0)} ms of CPU between them"
        )
    if not lines:
        return []
    return [
        "Why it grows with the number of pods here: a join wakes every daemon, and each runs "
        "a reconcile pass (it reads the whole device over UAPI, computes the desired peers "
        "from the whole view, diffs, sets the one peer, reads the device again and adds the "
        "route through a netlink thread). On one machine those passes queue for the same "
        "cores; in a cluster each daemon has its own. " + "; ".join(lines) + ".",
        "",
    ]


def _propagation_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    for i, (size, _) in enumerate(by_size(r["summary"]["by_size"])):
        runs = [x for x in r["runs"] if str(x["size"]) == size]
        steady = [s for x in runs for j in x["steady"] for s in j["samples_ms"]]
        startup = [s for x in runs for s in x["startup"]["samples_ms"]]
        cdf(ax, steady, f"{size} pods, steady", "-", f"C{i}")
        cdf(ax, startup, f"{size} pods, start-up", "--", f"C{i}")
    ax.axvline(100, color="grey", linestyle=":", label="target p99")
    ax.set_xlabel("registration committed → peer on the device (ms)")
    ax.set_ylabel("fraction of samples")
    ax.set_title("Propagation latency (CDF)")
    ax.legend(fontsize=7)


def full_mesh_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 2. Time to full mesh", ""]
    if r is None:
        return out + ["Not measured (run `bench/formation.py`).", ""], None
    s = r["summary"]["by_size"]
    rows = []
    for size, v in by_size(s):
        rows.append([
            size, str(v["runs"]), mmm(v["start_span"]), mmm(v["from_last_start"], 2),
            mmm(v["from_last_ready"], 2), num(v["start_to_ready"]["p50"], 2),
            f"{num(v['rank0_from_start']['p50'], 2)} / {num(v['rank0_from_start']['p90'], 2)}",
            f"{num(v['rank0_from_ready']['p50'], 2)} / {num(v['rank0_from_ready']['p90'], 2)}",
        ])  # fmt: skip
    target_size = str(r["summary"]["target_size"])
    met = None
    if target_size in s and s[target_size]["from_last_ready"]["max"] is not None:
        met = s[target_size]["from_last_ready"]["max"] <= r["summary"]["target_s"]
    gap = r["params"]["max_gap_s"]
    out += [
        f"N ranks started in a random order with random gaps (0–{gap:g} s); a UDP prober in",
        "every pod sends to each other rank's overlay address until it first answers. Full",
        "mesh = every ordered pair has exchanged a packet. Seconds, median (min–max) over",
        "runs. *Ready* = the daemon logged its claim (address up, rank claimed: what",
        "`/readyz` reports). Rank 0 columns: for each rank started after rank 0 was ready,",
        "its start (or its readiness) → its first reply from rank 0, p50 / p90 over ranks.",
        "",
        *table(
            [
                "pods",
                "runs",
                "starts spread over",
                "full mesh after last start",
                "full mesh after last ready",
                "start → ready p50",
                "start → rank 0 answers",
                "ready → rank 0 answers",
            ],
            rows,
        ),  # fmt: skip
        plot("full_mesh", lambda ax: _full_mesh_plot(ax, r)),
        "",
        f"Target: full mesh within {r['summary']['target_s']:g} s of the last daemon's readiness "
        "at 64 pods (every run) — " + verdict(met) + f". Load: {load_note(r)}.",
        "",
        *_full_mesh_why(r),
        *failures_note(r),
    ]
    return out, met


def _full_mesh_why(r: JSON) -> list[str]:
    """The tail of each run: how long the last 1 % of the pairs took."""
    notes = []
    for run in r["runs"]:
        curve = run["curve"]
        if len(curve) < 100:
            continue
        at_99 = curve[int(len(curve) * 0.99) - 1][0]
        gap = curve[-1][0] - at_99
        if gap >= 1.0:
            notes.append(f"{run['size']} pods: {num(gap, 1)} s")
    if not notes:
        return []
    return [
        "The slow runs end with a long tail: the last 1 % of the pairs came well after the "
        "rest (" + ", ".join(notes) + "). Causes traced with wireguard-go's verbose log "
        "(`--trace-dir`, `bench/traces.py`; 64 pods and the 24-pod all-to-all): a first "
        "initiation dropped because the peer had registered just after the initiator and "
        'had not added it yet (wireguard-go\'s "Received invalid initiation message"; '
        "the initiator's re-add repairs it after 0.4 s, or 1 s for other pairs); and "
        "late joiners whose processes were not scheduled for up to a second on the loaded "
        "cores. No crossed initiations were seen. A pair waiting on WireGuard's own 5 s "
        "retry means a re-add failed three times.",
        "",
    ]


def _full_mesh_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    for size, _ in by_size(r["summary"]["by_size"]):
        runs = [x for x in r["runs"] if str(x["size"]) == size]
        if not runs:
            continue
        run = sorted(runs, key=lambda x: x["from_last_start"])[len(runs) // 2]
        total = int(size) * (int(size) - 1)
        xs = [p[0] for p in run["curve"]]
        ys = [p[1] / total for p in run["curve"]]
        (line,) = ax.plot(xs, ys, label=f"{size} pods (median run)")
        ax.plot(run["starts"], [0] * len(run["starts"]), "|", color=line.get_color(), ms=8)
    ax.set_xlabel("seconds since the first daemon started (ticks: daemon starts)")
    ax.set_ylabel("ordered pairs reached")
    ax.set_title("Mesh formation")
    ax.legend(fontsize=8)


def launcher_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 3. The launcher of today, side by side", ""]
    if r is None:
        return out + ["Not measured (run `bench/launcher.py`).", ""], None
    s = r["summary"]["by_size"]
    rows = []
    for size, v in by_size(s):
        rows.append([
            size, str(v["runs"]), mmm(v["vnetd_from_last_pod"], 2),
            mmm(v["launcher_from_last_pod"], 2), mmm(v["ratio_from_last_pod"], 1, unit="×"),
            mmm(v["vnetd_from_first_pod"], 1), mmm(v["launcher_from_first_pod"], 1),
            mmm(v["ratio_from_first_pod"], 2, unit="×"),
            mmm(v["launcher_workers_retried"], 0),
            mmm(v.get("vnetd_last_ready_after_last_pod"), 2),
            f"{mmm(v.get('vnetd_ready_to_hello_p50'), 2)} / "
            f"{mmm(v.get('vnetd_ready_to_hello_max'), 2)}",
        ])  # fmt: skip
    ratios = [v["ratio_from_last_pod"]["min"] for v in s.values() if v["ratio_from_last_pod"]["n"]]
    met = min(ratios) >= r["summary"]["target_ratio"] if ratios else None
    out += [
        "Time until rank 0 has a hello from every worker. Same lab, same N, same creation",
        "order and gaps for both sides, the side going first alternating. **Launcher**: once",
        "every pod exists, write a hosts file into every pod, restart every pod's process;",
        "workers connect to `lab-0` over the underlay and retry every 15 s. **vnetd**: each",
        "pod starts `vnetd up` and a ZeroMQ broker configured by `vnetd render flux` before",
        "any pod existed; workers connect to rank 0's fixed overlay address. The clock",
        "starts at the **last** pod's creation (all addresses exist: where the launcher's",
        "work begins) or at the **first** pod's creation (the whole wait, creation span",
        "included, the same on both sides). Seconds, median (min–max) over runs.",
        "",
        *table(
            [
                "pods",
                "runs",
                "vnetd, from last pod",
                "launcher, from last pod",
                "ratio",
                "vnetd, from first pod",
                "launcher, from first pod",
                "ratio",
                "workers that retried",
                "vnetd: last daemon ready, after last pod",
                "vnetd: worker and rank 0 ready → hello, p50 / max",
            ],
            rows,
        ),  # fmt: skip
        plot("launcher", lambda ax: _launcher_plot(ax, r)),
        "",
        'Target: at least 10× faster to "all ranks connected" (from the last pod, every run) — '
        + verdict(met)
        + f". Load: {load_note(r)}.",
        "",
        "What each side's time is made of: the launcher's is the hosts files, the restart of "
        "every pod's process, and a 15 s wait for each worker that tried before rank 0 "
        "listened (workers that retried, above). vnetd's is the last daemon becoming ready "
        "(its start costs CPU: Python imports, the key, wireguard-go, the first list, and it "
        "queues behind the other daemons still starting on the same cores) plus, for the "
        "slowest worker, the time from ready to hello: a worker's first handshake to rank 0 "
        "can leave before rank 0's daemon has added the worker; it is dropped and the tunnel "
        "waits for the initiator's re-add (0.4–1 s) and the next TCP SYN retransmission "
        "(1 s, then 2 s, ...).",
        "",
        *failures_note(r),
    ]
    return out, met


def _launcher_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    sizes = [size for size, _ in by_size(r["summary"]["by_size"])]
    width = 0.38
    for i, side in enumerate(("vnetd", "launcher")):
        meds = [r["summary"]["by_size"][s][f"{side}_from_last_pod"]["median"] or 0 for s in sizes]
        ax.bar([x + (i - 0.5) * width for x in range(len(sizes))], meds, width, label=side)
    ax.set_xticks(range(len(sizes)), [f"{s} pods" for s in sizes])
    ax.set_ylabel("seconds after the last pod's creation")
    ax.set_title("All ranks connected to rank 0 (median)")
    ax.legend()


def control_plane_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 4. Control-plane scale (simulated ranks)", ""]
    if r is None:
        return out + ["Not measured (run `bench/control_plane.py`).", ""], None
    s = r["summary"]["by_size"]
    p = r["params"]
    rows = []
    for size, v in by_size(s):
        rows.append([
            size, f"{v['procs']} × {int(size) // (v['procs'] or 1)}",
            f"{v['converged']}/{v['runs']}", mmm(v["converge_s"]), mmm(v["storm_s"]),
            mmm(v["cpu_s_per_daemon_to_full"], 3),
            mmm(v["cpu_share_per_daemon_rest"], 3, 100, " %"),
            mmm(v["etcd_storm_rps"], 0), mmm(v["etcd_rest_rps"], 0),
            f"{mmm(v['etcd_storm_cpu'], 0, 100, ' %')} / {mmm(v['etcd_rest_cpu'], 1, 100, ' %')}",
            mmm(v.get("etcd_us_per_event") or {}, 0), mmm(v.get("projection_s") or {}, 1),
        ])  # fmt: skip
    target = str(r["summary"]["target_size"])
    met = None
    if target in s:
        v = s[target]
        bound = r["summary"]["target_s"]
        met = v["converged"] == v["runs"] and (v["converge_s"]["max"] or math.inf) <= bound
    out += [
        "Whole daemons (`run_daemon`: spec check, claim under a lease, list-then-watch,",
        "reconciler), each with its own etcd client, key and instance, and an in-memory",
        f"`FakeDataplane`, packed into {p['procs']} processes (one per lab pod, ranks",
        f"interleaved), against one real etcd. Daemons start at {p['rate_per_s']:g} joins/s in",
        f"all; lease TTL {p['lease_ttl_s']} s (keepalive every {p['lease_ttl_s'] / 3:.1f} s),",
        f"resync every {p['resync_s']} s. *Converge* = last registration acknowledged →",
        "every daemon's device holds all N-1 peers. etcd requests = gRPC messages received",
        f"(scraped from its /metrics every second); *rest* = {p['rest_s']:g} s after",
        "convergence. Median (min–max) over runs.",
        "",
        *table(
            [
                "ranks",
                "processes × ranks",
                "converged",
                "converge s",
                "first start → full s",
                "CPU s per daemon to full",
                "CPU per daemon at rest",
                "etcd req/s, storm",
                "etcd req/s, rest",
                "etcd CPU storm / rest",
                "etcd µs per event",
                f"projected s, {target} ranks",
            ],
            rows,
        ),  # fmt: skip
        plot("control_plane", lambda ax: _control_plane_plot(ax, r)),
        "",
        f"Target: {target} simulated ranks fully meshed within "
        f"{r['summary']['target_s']:g} s of the last registration — "
        + verdict(met)
        + f". Load: {load_note(r)}.",
        "",
        *_control_plane_costs(r),
        *_control_plane_why(r),
        *failures_note(r),
    ]
    return out, met


def _control_plane_costs(r: JSON) -> list[str]:
    """The per-daemon and etcd costs against their targets, and how the projection is made."""
    s, target = r["summary"], str(r["summary"]["target_size"])
    cpu = (s["by_size"].get(target) or {}).get("cpu_s_per_daemon_to_full") or {}
    us = [v.get("etcd_us_per_event") or {} for _, v in by_size(s["by_size"])]
    worst_us = max((u["max"] for u in us if u.get("max") is not None), default=None)
    cpu_bound, us_bound = (
        s.get("target_cpu_s_per_daemon", 0.1),
        s.get("target_etcd_us_per_event", 30),
    )
    cpu_met = None if cpu.get("max") is None else cpu["max"] <= cpu_bound
    us_met = None if worst_us is None else worst_us <= us_bound
    return [
        f"Target: CPU per daemon to take {target} joins ≤ {cpu_bound:g} s — {verdict(cpu_met)}; "
        f"etcd CPU per delivered event in the storm ≤ {us_bound:g} µs — {verdict(us_met)}.",
        "",
        "*etcd µs per event* = all of etcd's CPU from the first start to full (grants, claims, "
        "lists and keepalives included) over the watch events it delivered meanwhile (its "
        "`etcd_debugging_mvcc_events_total`; N(N+1)/2 for N ranks: a daemon is sent every "
        f"registration after its own). *Projected*: time to full mesh at {target} ranks "
        "started at once, one core per daemon and a 4-core etcd, from the run's own costs: "
        f"least start → claim + CPU per daemon × {target}/N (a daemon's work is O(N), serial "
        f"on its core) + {target}·{int(target) + 1}/2 events × µs per event / 4 cores; the "
        "terms are added as if serial, an upper bound.",
        "",
    ]


def _control_plane_why(r: JSON) -> list[str]:
    """Why the simulation is slow on this machine: the work grows as N² (and N³)."""
    lines = []
    for run in r["runs"]:
        warned = run.get("warnings") or {}
        top = "; ".join(f"{n}× {k}…" for k, n in list(warned.items())[:4])
        state = (
            f"converged {num(run['converge_s'], 1)} s after the last registration"
            if run.get("converged")
            else f"had not converged after {num(run['storm_s'], 0)} s ({run['claimed']} "
            f"claims acknowledged, {run['full']} daemons holding every peer)"
        )
        storm = run["etcd_storm"]
        events = storm.get("mvcc_per_s", {}).get("events")
        etcd_cpu = (storm.get("etcd_cpu_share") or 0) * 100
        lines.append(
            f"{run['size']} ranks: registrations took {num(run['registration_span_s'], 0)} s "
            f"(scheduled: {num(run['size'] / r['params']['rate_per_s'], 0)} s); the mesh "
            f"{state}; etcd delivered {num(events, 0)} watch events/s using "
            f"{num(etcd_cpu, 0)} % of a core. The daemons logged: {top or 'nothing'}."
        )
    return [
        *(f"* {line}" for line in lines),
        "",
        "Why the 1024 figures are what they are here: forming a mesh of N is N²/2 watch "
        "events (every join is an "
        "event on every daemon's watch: about 524,000 for 1024 ranks), and each event costs "
        "etcd (µs per event, above) and the daemon that receives it (decode, then a pass "
        "over what changed). Together that is a few hundred CPU-seconds on 2 cores, "
        "more than the joins' own schedule (1024 at 25 per second) leaves, so registrations "
        "stretch out and the daemons fall behind during the storm and catch up "
        "after it. In a cluster each daemon has a CPU of its own and etcd has its own "
        "machine, so only the per-daemon share (CPU s per daemon, above) is paid in each pod. "
        "The simulation also packs 256 daemons into each event loop, so a daemon's etcd "
        "calls wait behind its neighbours' passes; hence the 60 s lease (a 10 s lease "
        "expired and members churned) and the 'registry unreachable' lines, which are calls "
        "that waited past their 5 s timeout.",
        "",
    ]


def _control_plane_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    twin = ax.twinx()
    for size, _ in by_size(r["summary"]["by_size"]):
        runs = [x for x in r["runs"] if str(x["size"]) == size]
        if not runs:
            continue
        run = runs[0]
        n = int(size)
        (line,) = ax.plot(run["claim_curve"], [(i + 1) / n for i in range(len(run["claim_curve"]))],
                          label=f"{size}: registered")  # fmt: skip
        ax.plot(run["full_curve"], [(i + 1) / n for i in range(len(run["full_curve"]))],
                "--", color=line.get_color(), label=f"{size}: holding all peers")  # fmt: skip
        series = run["etcd_series"]
        twin.plot([x[0] for x in series], [x[1] for x in series], ":", color=line.get_color(),
                  alpha=0.6)  # fmt: skip
    ax.set_xlabel("seconds since the sim processes started")
    ax.set_ylabel("fraction of daemons")
    twin.set_ylabel("etcd requests/s (dotted)")
    ax.set_title("Join storm: registrations, convergence, etcd load (first run)")
    ax.legend(fontsize=7, loc="center right")


def footprint_section(r: JSON | None) -> tuple[list[str], list[bool | None]]:
    out = ["## 5. Footprint", ""]
    if r is None:
        return out + ["Not measured (run `bench/footprint.py`).", ""], [None, None]
    s = r["summary"]
    rows = [
        [peers, mmm(v["vnetd_rss_mib"]), mmm(v["vnetd_pss_mib"]), mmm(v["wg_rss_mib"]),
         mmm(v["wg_pss_mib"])]
        for peers, v in sorted(s["steps"].items(), key=lambda kv: int(kv[0]))
    ]  # fmt: skip
    rs = s["restart_1023"]
    rows.append(["1023, after a restart", mmm(rs["vnetd_rss_mib"]), "", mmm(rs["wg_rss_mib"]), ""])
    rss_1023 = s["steps"].get("1023", {}).get("vnetd_rss_mib", {}).get("max")
    wg_1023 = s["steps"].get("1023", {}).get("wg_rss_mib", {}).get("max")
    met_rss = None if rss_1023 is None else rss_1023 <= s["target_rss_mib"]
    idle = s["idle_vnetd_share"]["max"]
    met_idle = None if idle is None else idle <= s["target_idle_share"]
    p = r["params"]
    out += [
        "One `vnetd up` (rank 0 of a 1024-rank mesh) with peers registered straight into",
        "etcd (valid records, endpoints nobody answers; no traffic). MiB, median (min–max)",
        "over runs; RSS counts shared library pages in full, PSS splits them.",
        "",
        *table(["peers", "vnetd RSS", "vnetd PSS", "wireguard-go RSS", "wireguard-go PSS"], rows),
        f"Idle CPU over {p['idle_s']:g} s at 1023 peers (keepalives, a resync every"
        f" {p['resync_s']} s, the watch resumed every 60 s): vnetd "
        f"{mmm(s['idle_vnetd_share'], 2, 100, ' %')}, wireguard-go "
        f"{mmm(s['idle_wg_share'], 2, 100, ' %')} of a core. A restart with 1023 peers"
        f" registered reaches them all in {mmm(rs['to_all_peers_s'], 2, unit=' s')} (its first"
        f" pass: {mmm(rs['first_pass_ms'], 0, unit=' ms')}).",
        "",
        plot("footprint", lambda ax: _footprint_plot(ax, r), (6, 3.5)),
        "",
        f"Target: ≤ {s['target_rss_mib']:g} MiB resident with 1023 peers — {verdict(met_rss)} "
        "(vnetd "
        f"{num(rss_1023)} MiB; wireguard-go {num(wg_1023)} MiB more). Target: idle CPU ≤ 0.5 % "
        f"of a core — {verdict(met_idle)}. Load: {load_note(r)}.",
        "",
        *_footprint_why(s),
        *failures_note(r),
    ]
    return out, [met_rss, met_idle]


def startup_section(r: JSON | None) -> tuple[list[str], bool | None]:
    """``bench/startup.py``: ``vnetd up`` starting → the rank's address on its interface."""
    out = ["## Start-up", ""]
    if r is None:
        return out + ["Not measured (run `bench/startup.py`).", ""], None
    s = r["summary"]
    rows = [
        [label, mmm(part["address_s"], 0, 1000, " ms"), mmm(part.get("cpu_at_address_s"), 0, 1000,
         " ms"), mmm(part["logged_starting_s"], 0, 1000, " ms"), mmm(part["claimed_s"], 0, 1000,
         " ms")]
        for label, part in (("every start", s["all"]), ("key already made", s["key_kept"]))
    ]  # fmt: skip
    worst = s["all"]["address_s"]["max"]
    ok = None if worst is None else worst <= s["target_address_s"]
    out += [
        f"`vnetd up` for one rank started {r['params']['runs']} times in a row in a lab pod",
        "(the first start also makes its key); from the process's spawn to the kernel",
        "announcing the rank's address on the interface (what a launcher waits on), to the",
        "daemon's `starting:` line (imports, settings, identity done) and to its claim.",
        "Median (min–max).",
        "",
        *table(
            [
                "",
                "address on the interface",
                "its CPU by then",
                "`starting:` logged",
                "rank claimed",
            ],
            rows,
        ),  # fmt: skip
        f"Target: address ≤ {s['target_address_s'] * 1000:.0f} ms after the start, every"
        f" start — {verdict(ok)}. Load: {load_note(r)}.",
        "",
        *failures_note(r),
    ]
    return out, ok


def _footprint_why(s: JSON) -> list[str]:
    one = s["steps"].get("1", {}).get("vnetd_rss_mib", {}).get("median")
    full = s["steps"].get("1023", {}).get("vnetd_rss_mib", {}).get("median")
    if one is None or full is None:
        return []
    return [
        f"Where the memory is: with one peer vnetd is already {num(one)} MiB resident, the "
        "Python interpreter (10 MiB) and the libraries it imports at start (measured one by one "
        "in a fresh interpreter: trio +11 MiB, pyroute2 +12 MiB with its package importing "
        "all of its modules, httpx +3, cryptography +1, prometheus-client +1); 1022 more peers "
        f"add {num(full - one)} MiB. The peers' cost is in wireguard-go. vnetd now imports "
        "only the pyroute2 modules it uses (its package __init__ deferred: 6 MiB less), and "
        "prometheus-client and the HTTP server only with [http] listen (docs/architecture.md, "
        "Start-up).",
        "",
    ]


def _footprint_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    steps = r["summary"]["steps"]
    xs = [int(p) for p in steps]
    for key, label in (("vnetd_rss_mib", "vnetd RSS"), ("wg_rss_mib", "wireguard-go RSS"),
                       ("vnetd_pss_mib", "vnetd PSS")):  # fmt: skip
        ax.plot(xs, [steps[p][key]["median"] for p in steps], "o-", label=label)
    ax.axhline(50, color="grey", linestyle=":", label="target (vnetd)")
    ax.set_xscale("log")
    ax.set_xlabel("peers configured")
    ax.set_ylabel("MiB")
    ax.set_title("Resident memory")
    ax.legend(fontsize=8)


def dataplane_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 6. Data plane", ""]
    if r is None:
        return out + ["Not measured (run `bench/dataplane.py`).", ""], None
    s = r["summary"]
    p = r["params"]
    ratio = s["ratio"]["min"]
    met = None if ratio is None else ratio >= s["target_ratio"]
    out += [
        "iperf3 TCP, pod 0 → pod 1, the same two pods at the same time: over vnetd's overlay",
        "and over a second wireguard-go (same binary) configured by hand with `wg`, alternating,"
        f" {p['rounds']} × {p['seconds']:g} s each per run (first second omitted), MTU 1420 on",
        "both. Gbit/s, median (min–max) over all tests; the ratio is per run (medians).",
        "",
        *table(
            ["vnetd overlay", "hand-made wireguard-go", "ratio", "underlay (veth)"],
            [
                [
                    mmm(s["vnetd_gbps"], 3),
                    mmm(s["hand_gbps"], 3),
                    mmm(s["ratio"], 3),
                    mmm(s["underlay_gbps"], 1),
                ]
            ],
        ),  # fmt: skip
        f"One peer change on a device with {p['peers_for_change']} peers, ms, median (min–max):",
        "",
        *table(
            [
                "vnetd: the whole reconcile pass (an endpoint moved)",
                "UAPI `set`, one peer updated",
                "UAPI add + remove one peer",
                "full replace (`replace_peers`, all peers)",
                "UAPI `get` (whole device)",
            ],
            [
                [
                    mmm(s["vnetd_pass_ms"]),
                    mmm(s["uapi_update_ms"], 2),
                    mmm(s["uapi_add_remove_ms"], 2),
                    mmm(s["uapi_replace_ms"]),
                    mmm(s["uapi_get_ms"], 2),
                ]
            ],
        ),  # fmt: skip
        "A live session with the other pod "
        + ("survives" if s["session_kept_after_update"] else "**does not survive**")
        + " the incremental updates and "
        + ("survives" if s["session_kept_after_replace"] else "is **dropped** by")
        + " the full replace (every tunnel has to handshake again).",
        "",
        plot("dataplane", lambda ax: _dataplane_plot(ax, r), (6, 3.5)),
        "",
        f"Target: throughput ratio ≥ 0.97 (every run) — {verdict(met)}. Load: {load_note(r)}.",
        "",
        *_dataplane_why(s),
        *failures_note(r),
    ]
    return out, met


def _dataplane_why(s: JSON) -> list[str]:
    notes = []
    for side, name in (("vnetd_gbps", "vnetd"), ("hand_gbps", "hand-made")):
        v = s[side]
        if v.get("min"):
            notes.append(f"{name} {num((v['max'] / v['min'] - 1) * 100, 0)} %")
    return [
        "Both sides are the same wireguard-go binary with the same MTU between the same "
        "pods; vnetd is not on the packet path. Between tests of one side, throughput varies "
        "by (max/min - 1): " + ", ".join(notes) + ", which bounds how exactly the ratio is "
        "known on 2 shared cores.",
        "",
    ]


def _dataplane_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    data = {side: [x for run in r["runs"] for x in run["gbps"][side]] for side in ("vnetd", "hand")}
    ax.boxplot(list(data.values()))
    ax.set_xticks([1, 2], ["vnetd overlay", "hand-made wireguard-go"])
    ax.set_ylabel("Gbit/s")
    ax.set_title("iperf3 TCP between two pods")


def etcd_faults_section(r: JSON | None, cost: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 7. etcd cluster faults (3 members)", ""]
    if r is None:
        return out + ["Not measured (run `bench/etcd_faults.py`).", ""], None
    p = r["params"]
    rows = [
        [fault, mmm(v["reached_after_fault_s"], 2), mmm(v["reached_after_start_s"], 2),
         mmm(v["dropped_after_stop_s"], 2), str(v["claims_lost"]), str(v["probes_lost"])]
        for fault, v in r["summary"].items()
    ]  # fmt: skip
    met = all(v["claims_lost"] == 0 and v["probes_lost"] == 0 for v in r["summary"].values())
    out += [
        f"Five pods, three etcd 3.4 members, real wireguard-go, lease TTL {p['ttl']} s;",
        "every daemon is given all three endpoints. Ranks 0-3 are meshed, the fault lasts",
        f"{p['duration']:g} s; {p['start_after']:g} s into it rank 4 is started and rank 3's"
        " pod killed. *Reached* = the fault's start (or rank 4's) → rank 4 and every",
        "running rank have reached each other over the overlay; *dropped* = rank 3's kill",
        "→ no running rank has it as a peer (a kill during a leader change also waits for",
        "the new leader, which renews every lease: up to TTL + 2 s). Median (min–max) over",
        "runs; claims and probes lost in all runs.",
        "",
        *table(
            [
                "fault",
                "reached after fault s",
                "after its start s",
                "dropped s",
                "claims lost",
                "probes lost",
            ],
            rows,
        ),  # fmt: skip
        "",
        f"Target: no claim and no probe lost — {verdict(met)}. Load: {load_note(r)}.",
        "",
    ]
    if cost is not None:
        c = cost["summary"]
        out += [
            f"What keeping {cost['params']['watchers']} member watches healthy costs one etcd"
            " (its CPU, share of a core, over "
            f"{cost['params']['window_s']:g} s): plain watches "
            f"{100 * c['plain']:.1f} %, leader-required {100 * c['leader']:.1f} %, as the "
            f"daemons keep them (leader-required, and a linearizable read per quiet watch "
            f"every 3 s) {100 * c['checked']:.1f} %; with a serializable read instead "
            f"{100 * c.get('serializable', math.nan):.1f} %.",
            "",
        ]
    return out + failures_note(r), met


def bursting_section(r: JSON | None) -> list[str]:
    out = ["## 8. Bursting into a second site", ""]
    if r is None:
        return out + ["Not measured (run `bench/bursting.py`).", ""]
    s, p = r["summary"], r["params"]
    load = {k: mmm(v, 1) for k, v in s["loadavg_1m"].items()}
    out += [
        "Two sites behind their own NAT routers (`vnetd.lab.sites`): ranks 0-2 in site a,",
        "3-6 in site b, etcd on the public side, lease TTL "
        f"{p['lease_ttl_s']} s. Each run ({p['runs']}) has two phases in the same pods,",
        "alternating which goes first: **direct** (every member's port forwarded, each its",
        "own public endpoint) and **gateways** (only gateways 1 in a, 3 and 4 in b",
        "forwarded; 5 → 0 travels 5 → 3 → 1 → 0). Site a starts and meshes, then site b's",
        "ranks start (gateways first in that phase). Median (min–max); the last column",
        "is the 1-minute load average when the figure was taken. Start → readiness is the",
        "daemon's own start-up, which CPU load stretches; from readiness on it is the",
        "handshakes through the NATs (and gateways).",
        "",
        *table(
            ["site-b rank start → first reply from rank 0", "s", "load"],
            [
                ["direct, every rank", mmm(s["reach_direct_s"], 2), load["reach_direct"]],
                [
                    "gateways, the members",
                    mmm(s["reach_gateways_members_s"], 2),
                    load["reach_gateways"],
                ],
                [
                    "gateways, the gateways themselves",
                    mmm(s["reach_gateways_gateways_s"], 2),
                    load["reach_gateways"],
                ],
                [
                    "direct, from readiness (`claimed rank`)",
                    mmm(s["reach_direct_from_ready_s"], 2),
                    load["reach_direct"],
                ],
                [
                    "gateways, the members, from readiness",
                    mmm(s["reach_gateways_members_from_ready_s"], 2),
                    load["reach_gateways"],
                ],
            ],
        ),  # fmt: skip
        f"iperf3 TCP rank {p['iperf'][0]} (site b) → rank {p['iperf'][1]} (site a),"
        f" {p['seconds']:g} s each (first second omitted), Gbit/s; the ratio is per run. Every"
        " hop's wireguard-go shares the same 2 cores, so the relayed path pays its two extra"
        " decrypt-and-encrypt hops out of the CPU the endpoints also use:",
        "",
        *table(
            ["direct", "through the gateways", "ratio", "load (direct / gateways)"],
            [
                [
                    mmm(s["direct_gbps"], 3),
                    mmm(s["gateways_gbps"], 3),
                    mmm(s["ratio"], 2),
                    f"{load['iperf_direct']} / {load['iperf_gateways']}",
                ]
            ],
        ),  # fmt: skip
        f"Gateway {p['killed']} (site b's active one) killed by pid while every pod probes"
        f" every rank each {p['probe_interval_s']:g} s: the longest gap in replies of any"
        f" cross-site pair **{mmm(s['failover_gap_s'], 2)} s**; the last lost request was sent"
        f" {mmm(s['failover_resumed_s'], 2)} s after the kill (load {load['failover']}). The"
        " pause is the rest of the dead gateway's lease (renewed every TTL/3, so 2/3 TTL to one"
        " TTL after a crash): when its entry ends, every daemon moves its routes to the standby"
        " gateway.",
        "",
        f"Load: {load_note(r)}.",
        "",
    ]
    return out + failures_note(r)


def numbered(lines: list[str]) -> list[str]:
    """The sections after the targets, numbered in page order (each section names
    its own title; the number comes from where it lands)."""
    out, n = [], 0
    for line in lines:
        if line.startswith("## ") and line != "## Targets":
            n += 1
            line = f"## {n}. " + re.sub(r"^\d+\. ", "", line[3:])
        out.append(line)
    return out


def targets_table(verdicts: list[tuple[str, bool | None]]) -> list[str]:
    return table(["target", "result"], [[name, verdict(ok)] for name, ok in verdicts])


def render(results_dir: Path, doc: Path) -> None:
    names = (
        "propagation", "full_mesh", "launcher", "control_plane", "footprint", "dataplane",
        "etcd_faults", "etcd_watch_cost", "all_to_all", "bursting", "etcd_transport",
        "startup", "doctor",
    )  # fmt: skip
    results = {n: r for n in names if (r := read_result(n, results_dir)) is not None}
    PLOTS["dir"] = doc.parent / "benchmarks"
    prop, prop_ok = propagation_section(results.get("propagation"))
    mesh, mesh_ok = full_mesh_section(results.get("full_mesh"))
    launch, launch_ok = launcher_section(results.get("launcher"))
    scale, scale_ok = control_plane_section(results.get("control_plane"))
    foot, (rss_ok, idle_ok) = footprint_section(results.get("footprint"))
    start, start_ok = startup_section(results.get("startup"))
    data, data_ok = dataplane_section(results.get("dataplane"))
    faults, faults_ok = etcd_faults_section(
        results.get("etcd_faults"), results.get("etcd_watch_cost")
    )
    from report_all_to_all import all_to_all_section  # it imports this module's helpers

    a2a, a2a_ok = all_to_all_section(results.get("all_to_all"))
    # The section verdicts of propagation, full mesh, scale, footprint, start-up and
    # the all-to-all are judged again, against issue 16's figures, in target_rows.
    del prop_ok, mesh_ok, scale_ok, rss_ok, idle_ok, start_ok, a2a_ok
    verdicts = [
        ("throughput ≥ 0.97 × hand-configured wireguard-go", data_ok),
        ("≥ 10× faster than the launcher of today to all ranks connected", launch_ok),
        ("no claim or probe lost when an etcd member is killed, frozen or partitioned", faults_ok),
    ]  # fmt: skip
    issue16 = target_rows(results)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bench/run_all` (`bench/report.py` renders this page from",
        "`bench/results/*.json`; do not edit it by hand). How to run the benches and what",
        "each one does: [bench/README.md](../bench/README.md). Everything runs on one",
        "machine in the netns lab: every pod, wireguard-go and etcd share its CPUs, so",
        "figures that depend on CPU (start-up, propagation at 64 pods, 1024 simulated",
        "ranks) measure a 2-core machine doing the work of a whole cluster.",
        "",
        *machine_section(results),
        "## Targets",
        "",
        "The figures issue 16 set (before: as the issue was filed), each from the section",
        "below that measures it:",
        "",
        *table(
            ["figure", "before", "target", "now", "result"],
            [[*row, verdict(met)] for row, met in issue16],
        ),
        "Earlier targets:",
        "",
        *targets_table(verdicts),
        *prop,
        *mesh,
        *a2a,
        *launch,
        *scale,
        *foot,
        *start,
        *data,
        *faults,
        *bursting_section(results.get("bursting")),
        *etcd_transport_section(results.get("etcd_transport")),
        *doctor_section(results.get("doctor")),
    ]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(numbered(lines)).rstrip() + "\n")
    print(f"wrote {doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc} and its plots")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args()
    render(args.results, args.doc)


if __name__ == "__main__":
    main()
