"""The benchmark page's section on the first all-to-all (``bench/all_to_all.py``).

``report.py`` calls it; the helpers it shares with the other sections are in
``report_format.py``.
"""

from __future__ import annotations

from common import JSON
from report_format import by_size, failures_note, load_note, mmm, num, table, verdict


def all_to_all_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## First all-to-all, rank 0 last", ""]
    if r is None:
        return out + ["Not measured (run `bench/all_to_all.py`).", ""], None
    s = r["summary"]["by_size"]
    rows = [
        [size, str(v["runs"]), mmm(v["from_last_start"], 2), mmm(v["from_last_ready"], 2),
         mmm(v.get("rank0_start_to_ready"), 2),
         mmm(v["slowest_pair"], 2), mmm(v.get("slowest_after_both_ready"), 2),
         mmm(v["pair_p50"], 2), mmm(v["over_1s"], 0), mmm(v["over_2s"], 0), str(v["pairs"])]
        for size, v in by_size(s)
    ]  # fmt: skip
    target = str(r["summary"]["target_size"])
    met = None
    if target in s and s[target]["from_last_start"]["max"] is not None:
        met = s[target]["from_last_start"]["max"] <= r["summary"]["target_s"]
    gap = r["params"]["max_gap_s"]
    out += [
        f"N ranks started in a random order with random gaps (0–{gap:g} s), rank 0 last, as",
        "a launcher starts a job's pods; right after the last start every rank sends to every",
        "other at once (a UDP prober in each pod, held until then), each retrying until the",
        "target answers, as an MPI job's first all-to-all. Seconds from the last start until",
        "every ordered pair has answered, median (min–max) over runs; *ready* = the last",
        "daemon logged its claim. Pair columns: each ordered pair's time from the last start",
        "(or from when both its ends were ready and the sender sending: the handshake, without",
        "the start-up).",
        "",
        *table(
            [
                "pods",
                "runs",
                "all answered after last start",
                "after last ready",
                "rank 0 start → ready",
                "slowest pair",
                "slowest pair after both ready",
                "pair p50",
                "pairs over 1 s",
                "pairs over 2 s",
                "pairs",
            ],
            rows,
        ),  # fmt: skip
        f"Target: every pair answered within {r['summary']['target_s']:g} s of the last start "
        f"at {target} pods (every run) — {verdict(met)}. Load: {load_note(r)}.",
        "",
        *_why(r, target, met),
        *failures_note(r),
    ]
    return out, met


def lazy_arm_section(eager: JSON | None, lazy: JSON | None) -> tuple[list[str], bool | None]:
    """The same all-to-all with lazy pairs (``--tree-fanout K``, issue 46), beside the eager
    arm of the same run: handshakes the daemons started against N × (K + 2), and the time
    from the last start against the eager arm's."""
    out = ["### The same with handshakes that follow the traffic", ""]
    if lazy is None:
        return out + ["Not measured (run `bench/all_to_all.py --tree-fanout K`).", ""], None
    k = lazy["params"]["tree_fanout"]
    # Paired runs (``--paired``) put both arms on one start schedule, back to back, so the
    # arms compare by their medians; unpaired ones, each arm's slowest run.
    paired = bool(lazy["params"].get("paired")) and bool(
        (eager or {}).get("params", {}).get("paired")
    )
    stat = "median" if paired else "max"
    rows, met = [], None
    for size, v in by_size(lazy["summary"]["by_size"]):
        other = (eager or {}).get("summary", {}).get("by_size", {}).get(size, {})
        started, bound = v.get("handshakes_started"), v.get("handshake_bound")
        fast = other.get("from_last_start", {}).get(stat)
        within = started is not None and bound is not None and started["max"] <= bound
        not_slower = (
            fast is not None
            and v["from_last_start"][stat] is not None
            and (v["from_last_start"][stat] <= fast)
        )
        if size == str(lazy["summary"]["target_size"]):
            met = within and not_slower
        eager_started = other.get("handshakes_started")
        rows.append([size, str(v["runs"]), mmm(started, 0), str(bound), mmm(eager_started, 0),
                     mmm(v["from_last_start"], 2), mmm(other.get("from_last_start"), 2),
                     mmm(v["slowest_after_both_ready"], 2), mmm(v["over_2s"], 0)])  # fmt: skip
    out += [
        f"`[mesh] tree_fanout = {k}`: pairs off the jobs' {k}-ary tree start no handshake until",
        'their first packet (docs/architecture.md, "Reconciler"). Targets (issue 46): the',
        "handshakes the daemons started at most N × (fan-out + 2) in every run, and every pair",
        "answered no later after the last start than in the eager arm of the same run: "
        + (
            "each run starts both arms in one order with the same gaps, back to back, the "
            "first arm alternating from run to run, and the arms compare by their medians "
            "over the runs (the slowest run of either is the start whose last daemon waited "
            "longest for the shared cores, the same code in both arms)."
            if paired
            else "each arm's slowest run against the other's (the arms ran one after the other)."
        ),
        "",
        *table(
            [
                "pods",
                "runs",
                "handshakes started",
                "bound",
                "eager arm's",
                "all answered after last start",
                "eager arm's",
                "slowest pair after both ready",
                "pairs over 2 s",
            ],
            rows,
        ),  # fmt: skip
        f"Verdict at {lazy['summary']['target_size']} pods — {verdict(met)}. "
        f"Load: {load_note(lazy)}.",
        "",
        *_lazy_why(eager, lazy, met),
        *failures_note(lazy),
    ]
    return out, met


def _lazy_why(eager: JSON | None, lazy: JSON, met: bool | None) -> list[str]:
    """Where a missed lazy verdict's time went: rank 0's start against the handshakes."""
    size = str(lazy["summary"]["target_size"])
    v = lazy["summary"]["by_size"].get(size, {})
    e = (eager or {}).get("summary", {}).get("by_size", {}).get(size, {})
    keys = ("rank0_start_to_ready", "from_last_ready")
    if met is not False or any(v.get(k) is None or e.get(k) is None for k in keys):
        return []
    return [
        "What differs between the arms: rank 0's start → ready, "
        f"{mmm(v['rank0_start_to_ready'], 2)} s lazy against "
        f"{mmm(e['rank0_start_to_ready'], 2)} s eager (the daemons' start-up on the 2 "
        "shared cores, before any handshake), and from the last readiness until every "
        f"pair answered, {mmm(v['from_last_ready'], 2)} s lazy against "
        f"{mmm(e['from_last_ready'], 2)} s eager (the handshakes).",
        "",
    ]


def _why(r: JSON, target: str, met: bool | None) -> list[str]:
    """What the time from the last start is made of: rank 0's start-up, then handshakes."""
    v = r["summary"]["by_size"].get(target)
    if met is not False or v is None or v.get("rank0_start_to_ready") is None:
        return []
    spans = [run["start_span"] for run in r["runs"] if str(run["size"]) == target]
    return [
        "What the time from the last start is made of: rank 0, started last, is ready "
        f"{mmm(v['rank0_start_to_ready'], 2)} s after its start, and from the last "
        f"readiness every pair answered within {mmm(v['from_last_ready'], 2)} s (no pair "
        f"needed over {num(v['slowest_after_both_ready']['max'], 2)} s once both its ends "
        f"were ready). The {target} daemons start within {num(max(spans, default=0), 1)} s "
        "of each other on the same 2 cores, and each start costs about 0.2 s of CPU up to "
        "its claim (section Start-up), so the last one waits for the CPU the others take. "
        "In a cluster each pod starts on its own CPU: rank 0's start → ready would be one "
        "start's time (Start-up), which leaves the handshakes well inside the target.",
        "",
    ]
