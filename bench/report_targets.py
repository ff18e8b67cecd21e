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
from report_formation import join_cpu_ms


@dataclass(frozen=True)
class Target:
    figure: str
    before: str
    limit: float
    unit: str
    measure: Callable[[dict[str, JSON]], float | None]
    """The figure from the results (``None``: not measured)."""


def dig(results: dict[str, JSON], name: str, *path: str) -> float | None:
    """The number at ``path`` under result ``name``'s summary; None where there is none."""
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
           lambda r: dig(r, "launcher", "by_size", "8", "vnetd_from_last_pod", "max")),
    Target("64 pods: full mesh after the last ready, every run", "11.7 s (8.6–14.7)", 2.0, "s",
           lambda r: dig(r, "full_mesh", "by_size", "64", "from_last_ready", "max")),
    Target("64 pods: full mesh after the last start, every run", "18.7 s; 51.8 s", 5.0, "s",
           lambda r: dig(r, "full_mesh", "by_size", "64", "from_last_start", "max")),
    Target("slowest pair after both ends ready, 64 pods", "7–13 s", 1.5, "s",
           slowest_pair_after_both_ready),
    Target("rank 0 last, every pair sending at once from the last start: all answered, "
           "24 pods, every run", "3.8 and 15.1 s", 2.0, "s",
           lambda r: dig(r, "all_to_all", "by_size", "24", "from_last_start", "max")),
    Target("1024 simulated ranks, 2 cores: converged after the last registration",
           "never (341 s window)", 60.0, "s",
           lambda r: _converged(r, 1024)),
    Target("per-daemon CPU to take 1023 joins (1024 simulated ranks)", "0.52 s", 0.1, "s",
           lambda r: dig(r, "control_plane", "by_size", "1024", "cpu_s_per_daemon_to_full",
                          "median")),
    Target("etcd CPU per delivered member event during a storm (1024 simulated ranks)",
           "≈ 100–150 µs", 30.0, "µs",
           lambda r: dig(r, "control_plane", "by_size", "1024", "etcd_us_per_event", "median")),
    Target("etcd CPU per delivered member event, watch delivery alone, batched through the "
           "JSON gateway (64 watchers)", "≈ 35 µs", 30.0, "µs",
           lambda r: dig(r, "etcd_transport", "json_batched", "etcd_us_per_event", "median")),
    Target("steady propagation at 8 pods, p50 (pooled)", "33 ms", 20.0, "ms",
           lambda r: dig(r, "propagation", "by_size", "8", "steady", "p50")),
    Target("steady propagation at 64 pods, p99 (pooled)", "306 ms; 747 ms", 150.0, "ms",
           lambda r: dig(r, "propagation", "by_size", "64", "steady", "p99")),
    Target("`vnetd up` start → address on the interface, every start", "0.67–0.86 s", 0.35, "s",
           lambda r: dig(r, "startup", "all", "address_s", "max")),
    Target("one daemon RSS at 1023 peers", "63.5 MiB", 55.0, "MiB",
           lambda r: dig(r, "footprint", "steps", "1023", "vnetd_rss_mib", "max")),
    Target("one change at 1023 peers: the daemon's whole pass (median)", "41 ms; 86 ms", 2.0, "ms",
           lambda r: dig(r, "dataplane", "vnetd_pass_ms", "median")),
    Target("idle CPU right after 1023 joins (share of a core)", "2.2 %", 0.5, "%",
           lambda r: _scaled(dig(r, "footprint", "idle_vnetd_share", "max"), 100)),
)  # fmt: skip


def _converged(results: dict[str, JSON], size: int) -> float | None:
    """The slowest run's time to full mesh; ``inf`` when a run of ``size`` never got there."""
    runs = dig(results, "control_plane", "by_size", str(size), "runs")
    if not runs:
        return None
    if (dig(results, "control_plane", "by_size", str(size), "converged") or 0) < runs:
        return math.inf
    return dig(results, "control_plane", "by_size", str(size), "converge_s", "max")


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


@dataclass(frozen=True)
class PageBefore:
    """What the page that stood before measured that this page's texts compare with."""

    decode_unsigned_us: float
    """An unsigned member record's decode (``record_proof.py``: pure CPU, one core): CPU
    figures are comparable across pages only as this figure is (the hosts vary)."""
    date: str
    cpu: str
    propagation_p99_ms: float
    """Steady propagation at 64 pods, p99 (issue 28's table), on that page."""


SPEED_BEFORE = PageBefore(12.25, "2026-12-03", "Intel(R) Xeon(R) Processor", 149)


def slower_than_before(r: dict[str, JSON]) -> float | None:
    """How many times slower at pure CPU this page's host is than ``SPEED_BEFORE``'s."""
    decode = dig(r, "record_proof", "decode_unsigned_us")
    return None if decode is None else decode / SPEED_BEFORE.decode_unsigned_us


def _why_propagation(r: dict[str, JSON]) -> str | None:
    propagation = r.get("propagation") or {}
    cpu = join_cpu_ms(propagation, "64")
    p99 = dig(r, "propagation", "by_size", "64", "steady_p99_runs", "max")
    cores = (propagation.get("machine") or {}).get("cores")
    if cpu is None or p99 is None or not cores:
        return None
    own, wg = cpu
    floor = 64 * (own + wg) / cores
    slower = slower_than_before(r)
    host = (
        f"; this host is {slower:.1f}× slower at pure CPU than the one of "
        f"{SPEED_BEFORE.date}'s page, where the figure was met "
        f"({SPEED_BEFORE.propagation_p99_ms:g} ms): machine table, CPU speed"
        if slower is not None and slower > 1.2
        else ""
    )
    return (f"a join costs every daemon CPU: from the registration until the last of the 64 "
            f"had the peer each spent {own:.1f} ms and its wireguard-go {wg:.1f} ms (medians), "
            f"{64 * (own + wg):.0f} ms of CPU between them, which {cores} cores cannot give in "
            f"less than {floor:.0f} ms (the worst run's p99: {p99:.0f} ms){host}")  # fmt: skip


@dataclass(frozen=True)
class CostTarget:
    """A figure of issue 28's table, and where it is missed, what the results measured
    that says why (``why``: None when they hold nothing that does)."""

    figure: str
    before: str
    limit: float
    unit: str
    measure: Callable[[dict[str, JSON]], float | None]
    why: Callable[[dict[str, JSON]], str | None]
    how: Callable[[dict[str, JSON]], str | None] = lambda r: None
    """What a reader needs to know of how the figure was taken, met or not."""


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f} ms"


def _s(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f} s"


def _why_startup(r: dict[str, JSON]) -> str | None:
    floor = dig(r, "startup", "all", "floor_cpu_s", "median")
    claim = dig(r, "startup", "all", "cpu_at_claim_s", "median")
    if floor is None or claim is None:
        return None
    return (f"the libraries a daemon imports before its claim (trio, httpx, httpcore, "
            f"cryptography, the standard modules), imported alone by a bare interpreter, "
            f"cost {_ms(floor)} of CPU here: the target is below them; vnetd's own share of "
            f"the {_ms(claim)} (median) is {_ms(claim - floor)}")  # fmt: skip


def _why_launcher(r: dict[str, JSON]) -> str | None:
    last = dig(r, "launcher", "by_size", "64", "vnetd_last_ready_after_last_pod", "max")
    ready = dig(r, "launcher", "by_size", "64", "vnetd_start_to_ready_p50", "median")
    alone = dig(r, "startup", "all", "claimed_s", "median")
    if last is None or ready is None:
        return None
    why = (
        f"{_s(last)} of it is the last daemon becoming ready after the last pod: at 64 "
        f"pods a daemon's start → ready takes {_s(ready)} (median) against "
        f"{_s(alone)} for one daemon alone (start-up section), the 64 starts and "
        "their wireguard-go sharing 2 cores; in a cluster each pod has its own CPUs"
    )
    runs = [run for run in (r.get("launcher") or {}).get("runs", []) if run["size"] == 64]
    slowest = max(runs, key=lambda run: run["vnetd"]["from_last_pod"], default=None)
    if slowest is None or "last_daemon_cpu_s" not in slowest["vnetd"]:
        return why  # results from before the last pod's CPU was read
    mine = slowest["vnetd"]
    busy = mine["last_start_cores_busy"]
    return (
        f"{why}. In the slowest run the last pod's daemon was ready "
        f"{_s(mine['last_start_to_ready'])} after its start, with "
        f"{_s(mine['last_daemon_cpu_s'])} of its own CPU, while the cores were "
        f"{busy:.0%} busy"
        + (": the rest of its start was a wait for a core" if busy >= 0.9 else "")
    )


def _why_join(r: dict[str, JSON]) -> str | None:
    signed = dig(r, "record_proof", "decode_signed_us")
    unsigned = dig(r, "record_proof", "decode_unsigned_us")
    part = {key: dig(r, "join_storm", key, "median") for key in (
        "cpu_s", "proofs_cpu_s", "rest_share_s", "rest_cpu_per_s", "join_path_cpu_s",
        "join_path_us")}  # fmt: skip
    inside = {key: dig(r, "join_storm", key, "median") for key in (
        "device_cpu_s", "watch_opens", "passes")}  # fmt: skip
    if signed is None or unsigned is None or part["cpu_s"] is None:
        return None
    decodes = (f"a signed record decodes in {signed:.0f} µs, an unsigned one in "
               f"{unsigned:.0f}: record proofs section")  # fmt: skip
    why = "The signatures are what keeps a registry writer from taking a live rank (issue 25)"
    if None in part.values():  # results of a join_storm.py that did not split its CPU
        proof = (signed - unsigned) * 1023 / 1e6
        return (f"checking the 1023 records' signatures alone costs {proof * 1000:.0f} ms "
                f"({decodes}), {proof / 0.1:.0%} of the target; the rest of the "
                f"{_ms(part['cpu_s'])} (median) is the unsigned join path (watch decoding, the "
                f"view, the reconciler's passes, the fake device). {why}")  # fmt: skip
    proofs = part["proofs_cpu_s"]
    return (f"of the {_ms(part['cpu_s'])} (medians over the runs), checking the 1023 "
            f"records' signatures takes {_ms(proofs)}, timed in the daemon: "
            f"{proofs / 0.1:.0%} of the target alone ({decodes}). "
            f"{_ms(part['rest_share_s'])} is what the daemon spends at rest anyway "
            f"({part['rest_cpu_per_s'] * 1000:.1f} ms a second once full: keepalives, "
            f"quiet checks, timers) over the storm's length; the joins' own path is "
            f"{_ms(part['join_path_cpu_s'])}, {part['join_path_us']:.0f} µs a join (the watch "
            f"and its resumes, decoding, the view, the reconciler's passes, the fake device"
            f"{_join_parts(inside)}). {why}")  # fmt: skip


def _join_parts(inside: dict[str, float | None]) -> str:
    """What the join path's split says of it (results from before it: nothing)."""
    if None in inside.values():
        return ""
    return (f": {_ms(inside['device_cpu_s'])} of it in the fake device, where a real daemon "
            f"writes to its device instead; {inside['watch_opens']:.0f} watch streams "
            f"opened, one a batch, and {inside['passes']:.0f} passes")  # fmt: skip


def _why_rest(r: dict[str, JSON]) -> str | None:
    runs = _rest_runs(r)
    if not runs:
        return None
    run = runs[0]
    rates = (run.get("etcd_rest") or {}).get("received_per_s") or {}
    keepalive = rates.get("LeaseKeepAlive")
    total = (run.get("etcd_rest") or {}).get("requests_per_s")
    params = r["control_plane"]["params"]
    ttl = params["lease_ttl_s"]
    every = (params.get("keepalive_s") or {}).get("1024", ttl / 3)
    if keepalive is None or total is None:
        return None
    return (f"{keepalive:.1f} req/s of the {total:.1f} are lease keepalives, one per daemon "
            f"every {every:g} s at rest ({1024 / every:.1f} a second for 1024 leases of {ttl} "
            f"s; etcd renews one lease per request); everything else is {total - keepalive:.1f} "
            "req/s. Fewer keepalives need a longer TTL, and the TTL is how long a dead "
            "rank's entry stays")  # fmt: skip


def _why_converge(r: dict[str, JSON]) -> str | None:
    run = _run(r, 1024)
    if run is None:
        return None
    projected = (run.get("projection_s") or {}).get("total_s")
    busy = (run.get("load") or {}).get("cpu_busy_mean")
    scheduled = 1024 / r["control_plane"]["params"]["rate_per_s"]
    storm = run.get("etcd_storm") or {}
    per_daemon, share = run.get("cpu_s_per_daemon_measured"), storm.get("etcd_cpu_share")
    demand = ""
    if per_daemon is not None and share is not None and storm.get("window_s"):
        demand = (f": the daemons spent {per_daemon * 1024:.0f} s of CPU and etcd "
                  f"{share * storm['window_s']:.0f} s, against the {2 * scheduled:.0f} "
                  "core-seconds 2 cores give in the schedule, so the simulation runs "
                  "saturated and its loops lag")  # fmt: skip
    # The run keeps its most frequent warning lines only: a count, not the total.
    expired = sum(n for line, n in (run.get("warnings") or {}).items() if "expired" in line)
    churn = (
        f"; keepalives time out ({expired} lease expiries logged) and each "
        "re-registration is one more event for every watcher"
        if expired
        else ""
    )
    registered = "" if run.get("claimed", 1024) >= 1024 else f" ({run['claimed']} of them)"
    paced = _run(r, 1024, paced=True)
    return (f"the run's 2 cores were {num_pct(busy)} busy on average, and its 1024 "
            f"registrations{registered} took {_s(run.get('registration_span_s'), 0)} instead "
            f"of the {scheduled:.0f} s scheduled{demand}{churn}: how long after the last "
            "registration it converges is then the lab's backlog. "
            f"{_paced_converge(paced)}{_projection(projected, paced)}")  # fmt: skip


def _paced_converge(paced: JSON | None) -> str:
    """The paced run's convergence, where there is one (``control_plane.py --paced``)."""
    if paced is None:
        return ""
    if not paced.get("converged"):
        return (f"At {paced['rate_per_s']:g} a second it did not converge in the window "
                "either. ")  # fmt: skip
    return (
        f"At {paced['rate_per_s']:g} a second, which the 2 cores kept up with "
        f"({num_pct((paced.get('load') or {}).get('cpu_busy_mean'))} busy), the same mesh "
        f"was full {_s(paced.get('converge_s'), 1)} after the last registration. "
    )


def _projection(projected: float | None, paced: JSON | None) -> str:
    """The projection for a cluster: the storm run's, else the paced run's."""
    how = "the run's own costs"
    if projected is None and paced is not None:
        projected = (paced.get("projection_s") or {}).get("total_s")
        how = f"the costs of the run at {paced['rate_per_s']:g} a second"
    del projected, how  # a whole run's etcd CPU per event was no sound basis (issue 46)
    return "The projection for a cluster is the scale model section's, from costs measured alone"


def num_pct(share: float | None) -> str:
    return "–" if share is None else f"{share * 100:.0f} %"


def _runs(r: dict[str, JSON], size: int, *, paced: bool = False) -> list[JSON]:
    """The control-plane runs of ``size`` ranks at the storm's rate (``paced``: the runs
    at a rate the lab keeps up with, ``control_plane.py --paced``)."""
    runs = (r.get("control_plane") or {}).get("runs", [])
    return [x for x in runs if x.get("size") == size and bool(x.get("paced")) == paced]


def _run(r: dict[str, JSON], size: int, *, paced: bool = False) -> JSON | None:
    runs = _runs(r, size, paced=paced)
    return runs[0] if runs else None


def _rest_runs(r: dict[str, JSON]) -> list[JSON]:
    """The 1024-rank runs that reached a rest: the storm's, else the paced ones."""
    for paced in (False, True):
        rested = [x for x in _runs(r, 1024, paced=paced) if x.get("converged")]
        if rested:
            return rested
    return []


def _rest_rps(r: dict[str, JSON]) -> float | None:
    rates = [x["etcd_rest"].get("requests_per_s") for x in _rest_runs(r)]
    rates = [x for x in rates if x is not None]
    return max(rates) if rates else None


def _how_rest(r: dict[str, JSON]) -> str | None:
    """Where the rest was measured, when the storm's own run had none."""
    runs = _rest_runs(r)
    if not runs or not runs[0].get("paced"):
        return None
    run = runs[0]
    rates = (run.get("etcd_rest") or {}).get("received_per_s") or {}
    parts = ", ".join(f"{k} {v:g}" for k, v in sorted(rates.items()) if v)
    return (f"at rest after the 1024 ranks registered at {run['rate_per_s']:g} a second (at "
            f"{r['control_plane']['params']['rate_per_s']:g} this host's 2 cores did not "
            f"converge: last row), over {_rest_window(r)}: {parts} req/s")  # fmt: skip


def _rest_window(r: dict[str, JSON]) -> str:
    rest = r["control_plane"]["params"].get("rest_s")
    seconds = rest.get("1024", rest.get("0")) if isinstance(rest, dict) else rest
    return f"{seconds:g} s" if seconds is not None else "the rest window"


COST_TARGETS = (
    CostTarget("`vnetd up` start → claim, CPU, every start", "210–220 ms", 0.12, "s",
               lambda r: dig(r, "startup", "all", "cpu_at_claim_s", "max"), _why_startup),
    CostTarget("launcher bench, 64 pods: all connected to rank 0 after the last pod, every "
               "run", "1.91 s (0.75–3.06)", 0.5, "s",
               lambda r: dig(r, "launcher", "by_size", "64", "vnetd_from_last_pod", "max"),
               _why_launcher),
    CostTarget("steady propagation, 64 pods, p99, every run", "196 ms", 150.0, "ms",
               lambda r: dig(r, "propagation", "by_size", "64", "steady_p99_runs", "max"),
               _why_propagation),
    CostTarget("one daemon's CPU to take 1023 signed joins (join storm), every run",
               "0.191 s (1024 simulated ranks)", 0.1, "s",
               lambda r: dig(r, "join_storm", "cpu_s", "max"), _why_join),
    CostTarget("1024 simulated ranks: etcd requests at rest", "367 req/s", 50.0, "req/s",
               _rest_rps, _why_rest, _how_rest),
    CostTarget("a frozen etcd member: a join reached after the fault, every run", "–", 10.0,
               "s", lambda r: dig(r, "etcd_faults", "frozen", "reached_after_fault_s", "max"),
               lambda r: None),
    CostTarget("1024 simulated ranks: converged after the last registration, every run",
               "10.1 s", 10.0, "s", lambda r: _converged(r, 1024), _why_converge),
)  # fmt: skip


def cost_rows(results: dict[str, JSON]) -> list[tuple[list[str], bool | None]]:
    """One row per figure of issue 28: figure, before, target, now, and why it is
    missed where the results say; and whether it is met."""
    rows = []
    for t in COST_TARGETS:
        now = t.measure(results)
        met = None if now is None else now <= t.limit
        why = "" if met or now is None else (t.why(results) or "not explained by these runs")
        how = t.how(results)
        why = "; ".join(part for part in (how, why) if part)
        rows.append(([t.figure, t.before, f"≤ {t.limit:g} {t.unit}", _shown(now, t.unit), why],
                     met))  # fmt: skip
    return rows
