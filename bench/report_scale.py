"""The benchmark page's section on the control plane at scale (``bench/control_plane.py``)."""

from __future__ import annotations

import math
from typing import Any

from common import JSON
from report_format import by_size, failures_note, load_note, mmm, num, plot, table, verdict


def control_plane_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 4. Control-plane scale (simulated ranks)", ""]
    if r is None:
        return out + ["Not measured (run `bench/control_plane.py`).", ""], None
    s = r["summary"]["by_size"]
    p = r["params"]
    rows = []
    paced = r["summary"].get("paced") or {}
    rates = r["params"].get("paced") or {}
    labelled = [(size, size, v) for size, v in by_size(s)]
    labelled += [(f"{size} at {rates.get(size, '?')}/s", size, v) for size, v in by_size(paced)]
    for label, size, v in labelled:
        rows.append([
            label, f"{v['procs']} × {int(size) // (v['procs'] or 1)}",
            f"{v['converged']}/{v['runs']}", mmm(v["converge_s"]), mmm(v["storm_s"]),
            mmm(v["cpu_s_per_daemon_to_full"], 3),
            mmm(v["cpu_share_per_daemon_rest"], 3, 100, " %"),
            mmm(v["etcd_storm_rps"], 0), mmm(v["etcd_rest_rps"], 0),
            f"{mmm(v['etcd_storm_cpu'], 0, 100, ' %')} / {mmm(v['etcd_rest_cpu'], 1, 100, ' %')}",
            mmm(v.get("etcd_us_per_event") or {}, 0),
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
        f"all{_paced_note(p)}; lease TTL {p['lease_ttl_s']} s ({_renewals(p)}),",
        f"{_resyncs(p)}. *Converge* = last registration acknowledged →",
        "every daemon's device holds all N-1 peers. etcd requests = gRPC messages received",
        f"(scraped from its /metrics every second); *rest* = {_rest(p['rest_s'])} after",
        "convergence. Median (min–max) over runs.",
        *_shared_proofs_note(r),
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


def _shared_proofs_note(r: JSON) -> list[str]:
    """What the CPU per daemon holds when the sims' daemons share their signature checks."""
    if not r["params"].get("shared_proofs"):
        return []
    checks = [run["proofs"] for run in r["runs"] if run.get("proofs")]
    us = [c["us_per_check"] for c in checks if c.get("verified")]
    rate = f"{min(us):.0f}–{max(us):.0f} µs" if us else "the measured cost"
    return [
        "The daemons of one process share their records' signature checks (each distinct",
        "record is verified once per process: 1024 daemons each verifying 1023 records on",
        "2 cores, 116 s of CPU, starved their keepalives until the run stopped converging);",
        f"*CPU s per daemon* adds every shared check back at the process's own rate ({rate}",
        "a check), as each daemon pays it on its own core in a cluster.",
    ]


def _rest(rest: float | dict[str, float]) -> str:
    """The rest window: one for every size, or per size (``--rest 256:60,1024:300``)."""
    if not isinstance(rest, dict):
        return f"{rest:g} s"
    return ", ".join(f"{seconds:g} s at {size}" for size, seconds in rest.items())


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
        "registration after its own): etcd's whole CPU, idle share included, so no cost "
        "per event to project from; the scale model section projects a cluster from costs "
        "measured one at a time instead.",
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
        rest = (run.get("etcd_rest") or {}).get("received_per_s") or {}
        at_rest = ", ".join(f"{k} {v:g}" for k, v in sorted(rest.items()) if v)
        events = storm.get("mvcc_per_s", {}).get("events")
        etcd_cpu = (storm.get("etcd_cpu_share") or 0) * 100
        rate = run.get("rate_per_s", r["params"]["rate_per_s"])
        paced = f" at {rate:g}/s" if run.get("paced") else ""
        lines.append(
            f"{run['size']} ranks{paced}: registrations took "
            f"{num(run['registration_span_s'], 0)} s (scheduled: {num(run['size'] / rate, 0)} s); "
            "the mesh "
            f"{state}; etcd delivered {num(events, 0)} watch events/s using "
            f"{num(etcd_cpu, 0)} % of a core; at rest it received (req/s) "
            f"{at_rest or 'nothing'}. The daemons logged: {top or 'nothing'}."
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
        runs = [x for x in r["runs"] if str(x["size"]) == size and not x.get("paced")]
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


def _renewals(p: JSON) -> str:
    """How often the daemons renewed their leases: a third of the TTL, and at rest as the
    run recorded it for each size (``control.renewal.renewal_interval``)."""
    ttl, by = p["lease_ttl_s"], p.get("keepalive_s")
    every = f"keepalive every {ttl / 3:.1f} s"
    spaced = {size: v for size, v in (by or {}).items() if v > ttl / 3}
    if not spaced:
        return every
    at_rest = ", ".join(f"every {v:.1f} s at {size}" for size, v in spaced.items())
    return f"{every}; at rest {at_rest}"


def _resyncs(p: JSON) -> str:
    """How often the daemons took their safety-net full pass, as the run recorded it for
    each size (``daemon.reconciler.FULL_PASS_PEERS``)."""
    every = f"resync every {p['resync_s']:g} s"
    spaced = {size: v for size, v in (p.get("resync_every_s") or {}).items()
              if v > p["resync_s"]}  # fmt: skip
    if not spaced:
        return every
    return every + "; " + ", ".join(f"every {v:g} s at {size}" for size, v in spaced.items())


def _paced_note(p: JSON) -> str:
    """The paced runs (``control_plane.py --paced``), if any, in the set-up's sentence."""
    paced = p.get("paced") or {}
    if not paced:
        return ""
    each = ", ".join(f"{size} ranks at {rate}/s" for size, rate in paced.items())
    return (
        f", and once more for {each} (rows *at N/s*: a rate these 2 cores keep up "
        "with, for the rest and the convergence a saturated storm hides)"
    )


# --- the scale model ----------------------------------------------------------------------

MODEL_TARGETS = ((1024, 3.0), (10_000, 10.0))
"""Ranks started at once, and the seconds to full mesh the issue asks of them."""
DAEMONS_PER_CACHE = 100
MODEL_HEADER = ("ranks", "read", "at least s", "at most s", "target", "result", "what stops it")
WRITES_PER_CLAIM = 2
"""Where the claims arm did not run, a claim (a lease grant and a create transaction) is
costed as two measured puts."""


def _median(r: JSON | None, *path: str) -> float | None:
    value: Any = r
    for key in path:
        value = (value or {}).get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def model_components(fanout: JSON | None, join_storm: JSON | None,
                     startup: JSON | None) -> dict[str, float | None]:  # fmt: skip
    """Each cost, measured in isolation by its own bench (median over its runs)."""
    arm = (fanout or {}).get("summary", {}).get("by_arm", {})
    return {
        "claim_s": _median(startup, "summary", "all", "claimed_s", "median"),
        "write_us": _median(arm, "writes", "etcd_us_per_write", "median"),
        "claim_us": _median(arm, "claims", "etcd_us_per_claim", "median"),
        "event_json_us": _median(arm, "direct-json", "etcd_us_per_event", "median"),
        "event_grpc_us": _median(arm, "direct-grpc", "etcd_us_per_event", "median"),
        "proxy_us": _median(arm, "proxy", "cache_us_per_record", "median"),
        "relay_us": _median(arm, "relay", "cache_us_per_record", "median"),
        "join_us": _median(join_storm, "summary", "us_per_join", "median"),
    }


def _claim_us(c: dict[str, float | None]) -> float:
    """etcd's CPU per claim: measured (the claims arm), else two measured writes."""
    if c.get("claim_us") is not None:
        return c["claim_us"] or 0.0
    return WRITES_PER_CLAIM * (c["write_us"] or 0.0)


def model_terms(n: int, way: str, c: dict[str, float | None]) -> dict[str, float] | None:
    """The terms of the time to full mesh of ``n`` ranks started at once, in seconds, read
    ``way`` (``direct``, ``proxy``, ``relay``); None where a component is not measured."""
    caches = -(-n // DAEMONS_PER_CACHE)
    event = c["event_json_us"] if way in ("direct", "relay") else c["event_grpc_us"]
    forward = {"direct": 0.0, "proxy": c["proxy_us"], "relay": c["relay_us"]}[way]
    needed = (c["claim_s"], c["write_us"], event, forward, c["join_us"])
    if any(x is None for x in needed):
        return None
    assert event is not None
    assert forward is not None
    watchers = n if way == "direct" else caches
    per_cache = -(-n // caches)
    return {
        "start → claim": c["claim_s"] or 0.0,
        "etcd: the claims": n * _claim_us(c) / 1e6,
        "etcd: events delivered": watchers * n * event / 1e6,
        "a cache: records forwarded": 0.0 if way == "direct" else per_cache * n * forward / 1e6,
        "a daemon: the joins": n * (c["join_us"] or 0.0) / 1e6,
    }


def scale_model_section(fanout: JSON | None, join_storm: JSON | None,
                        startup: JSON | None) -> tuple[list[str], bool | None]:  # fmt: skip
    """The projection for a cluster from the measured components, and what stops it."""
    c = model_components(fanout, join_storm, startup)
    out = ["## Scale model: ranks started at once on a cluster", ""]
    ways = ["direct", "proxy"] + (["relay"] if c["relay_us"] is not None else [])
    rows, verdicts = [], []
    for n, target in MODEL_TARGETS:
        for way in ways:
            terms = model_terms(n, way, c)
            if terms is None:
                rows.append([f"{n:,}", way, "–", "–", f"≤ {target:g} s", "not measured", ""])
                continue
            low, high = max(terms.values()), sum(terms.values())
            met = high <= target
            if way != "direct":
                verdicts.append(met)
            rows.append([f"{n:,}", way, num(low, 1), num(high, 1), f"≤ {target:g} s",
                         verdict(met), _stops(terms, target)])  # fmt: skip
    missing = [k for k, v in c.items() if v is None and k not in ("relay_us", "claim_us")]
    out += [
        "Each cost measured alone: *start → claim* (Start-up section, median); etcd's CPU",
        "per registration write and per delivered event, JSON gateway and gRPC, in the",
        "storm window with its at-rest CPU taken off, etcd pinned to a core of its own",
        "(Watch fan-out section); a cache's CPU per record it forwards (same section); a",
        "daemon's CPU per join (issue 28's join storm: `bench/join_storm.py`, everything",
        "it spends from its claim to full, signature checks and rest included, over the",
        "joins). " + _components_line(c),
        "",
        "The model, for N ranks started at once with a core per daemon, etcd on one core",
        f"and ⌈N/{DAEMONS_PER_CACHE}⌉ caches on cores of their own: etcd takes the N claims",
        f"({_claim_basis(c)}) and delivers every registration to every watch it",
        "holds (N² events directly: a daemon that lists before the others register is",
        "sent all N; ⌈N/100⌉·N through caches); each cache forwards every registration",
        "to its N/⌈N/100⌉ daemons; each daemon takes N joins. Each term is serial work on",
        "one core. The stages overlap (events flow while claims land), so the time to",
        "full mesh lies between the largest term (*at least*) and their sum (*at most*);",
        "a target is met when the sum is under it. etcd's term is for one core: more cores",
        "could divide it at best, which is not measured here. Left out: the daemons' first",
        "lists (served by the caches through them; directly, each can be up to N records",
        "from etcd), lease keepalives (N every TTL/3 s), and the data plane's handshakes.",
        "",
        *table(MODEL_HEADER, rows),
        *([f"Not measured, so not projected: {', '.join(missing)}.", ""] if missing else []),
        *_best_caches(c),
    ]
    return out, (all(verdicts) if verdicts else None)


def _claim_basis(c: dict[str, float | None]) -> str:
    if c.get("claim_us") is not None:
        return "each a lease grant and a create, as measured by the claims arm"
    return f"not measured alone: costed as {WRITES_PER_CLAIM} writes each"


def _components_line(c: dict[str, float | None]) -> str:
    def us(key: str) -> str:
        return "–" if c[key] is None else f"{c[key]:.1f} µs"

    claim = "–" if c["claim_s"] is None else f"{c['claim_s']:.2f} s"
    return (f"Here: start → claim {claim}; etcd {us('write_us')} a write, {us('claim_us')} a "
            f"claim, {us('event_json_us')} "
            f"an event (JSON), {us('event_grpc_us')} (gRPC); grpc-proxy {us('proxy_us')} a "
            f"record, vnetd relay {us('relay_us')}; a daemon {us('join_us')} a join.")  # fmt: skip


def _stops(terms: dict[str, float], target: float) -> str:
    """The term that stops a missed target, and by how much."""
    high = sum(terms.values())
    name, worst = max(terms.items(), key=lambda kv: kv[1])
    detail = ", ".join(f"{k} {v:.1f} s" for k, v in terms.items())
    if high <= target:
        return f"nothing ({detail})"
    if worst > target:
        return (f"{name}: {worst:.1f} s alone, {worst / target:.1f}× the target however the "
                f"stages overlap ({detail})")  # fmt: skip
    return (f"the terms in series, over by {high - target:.1f} s; {name} is the largest, "
            f"{worst:.1f} s: met only as far as the stages overlap ({detail})")  # fmt: skip


def _best_caches(c: dict[str, float | None]) -> list[str]:
    """The number of caches that minimises etcd's delivery term plus a cache's term."""
    event, forward = c["event_grpc_us"], c["proxy_us"]
    if not event or not forward or event <= 0 or forward <= 0:
        return []
    n = MODEL_TARGETS[-1][0]
    best = max(1, round(math.sqrt(n * forward / event)))
    both = (best * n * event + -(-n // best) * n * forward) / 1e6
    return [
        f"With grpc-proxy, etcd's term grows with the caches and each cache's shrinks: at "
        f"{n:,} ranks their sum is least with about {best} caches ({both:.1f} s for the two "
        "terms together); fewer events per cache need a second tier of caches fed by the "
        "first, which is not measured here.",
        "",
    ]
