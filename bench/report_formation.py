"""The benchmark page's sections on forming the mesh: propagation and time to full mesh
(``bench/formation.py``), and the launcher of today beside vnetd (``bench/launcher.py``).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from common import JSON
from report_format import by_size, cdf, failures_note, load_note, mmm, num, plot, table, verdict


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


def join_cpu_ms(r: JSON, size: str) -> tuple[float, float] | None:
    """A daemon's and its wireguard-go's CPU (ms, median over the steady joins of the
    ``size``-pod runs) from a join's registration until the last daemon had the peer."""
    joins = [j for x in r.get("runs", []) if str(x.get("size")) == size for j in x["steady"]]
    if not joins:
        return None
    cpu = [j["cpu_ms_per_daemon_until_joined"] for j in joins]
    return median([c["vnetd"] for c in cpu]), median([c["wireguard_go"] for c in cpu])


def _propagation_why(r: JSON) -> list[str]:
    """Why the figure grows with N on this machine: every daemon works on every join."""
    cores = r["machine"].get("cores") or 1
    lines = []
    for size, v in by_size(r["summary"]["by_size"]):
        cpu = join_cpu_ms(r, size)
        first = (v.get("first_observer_ms") or {}).get("median")
        if cpu is None or first is None:
            continue
        own, wg = cpu
        lines.append(
            f"{size} pods: the first daemon had the peer after {num(first)} ms; until the "
            f"last one had it each daemon spent {num(own)} ms of CPU and its wireguard-go "
            f"{num(wg)} ms (medians), so {size} of each on {cores} cores need about "
            f"{num(int(size) * (own + wg) / cores, 0)} ms between them"
        )
    if not lines:
        return []
    return [
        "Why it grows with the number of pods here: a join wakes every daemon, and each "
        "decodes the watch event, checks the member's signature, runs a pass over that "
        "member (a UAPI `set` adding the peer, its route, then a `set` starting the "
        "handshake where this side initiates) and logs it, while its wireguard-go applies "
        "the sets and sends the handshake. On one machine all of that queues for the same "
        "cores; in a cluster each pod has its own. " + "; ".join(lines) + ".",
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
            mmm(v.get("vnetd_syn_resent_workers"), 0),
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
                "vnetd: workers whose SYN was sent again",
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
        "slowest worker, the time from ready to hello: rank 0's daemon learns of the worker "
        "from its watch and adds it, its handshake completes, and the worker's broker "
        "connects. A hello about 1 s after ready is one TCP SYN retransmission (the workers "
        "whose SYN was sent again, counted by each pod's kernel; – where the run did not "
        "count them): until the handshakes waited for the peers' routes "
        '(docs/architecture.md, "Data plane and routing"), rank 0 could start one before '
        "the worker's route was in, and its SYN-ACK then met the overlay's unreachable route.",
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
