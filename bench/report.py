#!/usr/bin/env python3
"""Render ``docs/benchmarks.md`` and ``docs/benchmarks/*.png`` from ``bench/results/*.json``.

    .venv/bin/python bench/report.py [--results DIR] [--doc docs/benchmarks.md]

Needs matplotlib (the ``bench`` extra). A result that is missing gives a
section saying so; nothing is measured here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from common import JSON, RESULTS, ROOT, read_result
from report_all_to_all import all_to_all_section, lazy_arm_section
from report_doctor import doctor_section
from report_fanout import fanout_section
from report_faults import bursting_section, etcd_faults_section
from report_format import PLOTS, num, table, verdict
from report_formation import full_mesh_section, launcher_section, propagation_section
from report_host import dataplane_section, footprint_section, startup_section
from report_kernel import kernel_footprint_section, kernel_guest_section
from report_proof import record_proof_section
from report_relay import relay_footprint_section
from report_scale import control_plane_section, scale_model_section
from report_targets import SPEED_BEFORE, cost_rows, dig, slower_than_before, target_rows
from report_transport import etcd_transport_section
from report_trust import trust_rows

DOC = ROOT / "docs" / "benchmarks.md"


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
    decode = ((results.get("record_proof") or {}).get("summary") or {}).get("decode_unsigned_us")
    if decode is not None:
        b = SPEED_BEFORE
        rows.append(["CPU speed", f"an unsigned member record decodes in {decode:.1f} µs "
                     f"(record proofs section: pure CPU), {decode / b.decode_unsigned_us:.1f}× "
                     f"the {b.decode_unsigned_us} µs of the host of {b.date}'s page "
                     f"({b.cpu})"])  # fmt: skip
    return table(["", "machine"], rows)


def host_speed_note(results: dict[str, JSON]) -> list[str]:
    """A line under issue 16's table when this host is much slower than the one of the
    page before (these figures depend on CPU; the table has no column for why)."""
    slower = slower_than_before(results)
    if slower is None or slower < 1.5:
        return []
    return [
        f"This page's host is {slower:.1f}× slower at pure CPU than the one of "
        f"{SPEED_BEFORE.date}'s page (machine table, CPU speed): the figures above that "
        "depend on CPU are slower in about that proportion (that page's are in this "
        "file's history).",
        "",
    ]


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


ISSUE46_P50_MS = 22.3
"""Steady propagation at 8 pods, p50 pooled, on docs/benchmarks.md as issue 46 was filed
(commit 748477a): the figure issue 46 asks not to get worse."""


def targets_table(verdicts: list[tuple[str, bool | None]]) -> list[str]:
    return table(["target", "result"], [[name, verdict(ok)] for name, ok in verdicts])


def render(results_dir: Path, doc: Path) -> None:
    names = (
        "propagation", "full_mesh", "launcher", "control_plane", "footprint", "dataplane",
        "etcd_faults", "etcd_watch_cost", "all_to_all", "bursting", "etcd_transport",
        "startup", "doctor", "record_proof", "kernel_guest", "join_storm",
        "join_storm_rank_ca", "watch_fanout", "all_to_all_lazy", "kernel_footprint",
    )  # fmt: skip
    results = {n: r for n in names if (r := read_result(n, results_dir)) is not None}
    PLOTS["dir"] = doc.parent / "benchmarks"
    prop, prop_ok = propagation_section(results.get("propagation"))
    mesh, mesh_ok = full_mesh_section(results.get("full_mesh"))
    launch, launch_ok = launcher_section(results.get("launcher"))
    scale, scale_ok = control_plane_section(results.get("control_plane"))
    fanout, fanout_ok = fanout_section(results.get("watch_fanout"))
    model, model_ok = scale_model_section(
        results.get("watch_fanout"), results.get("join_storm"), results.get("startup")
    )
    foot, (rss_ok, idle_ok) = footprint_section(results.get("footprint"))
    start, start_ok = startup_section(results.get("startup"))
    data, data_ok = dataplane_section(results.get("dataplane"))
    faults, faults_ok = etcd_faults_section(
        results.get("etcd_faults"), results.get("etcd_watch_cost")
    )
    a2a, a2a_ok = all_to_all_section(results.get("all_to_all"))
    lazy, lazy_ok = lazy_arm_section(results.get("all_to_all"), results.get("all_to_all_lazy"))
    # The section verdicts of propagation, full mesh, scale, footprint, start-up and
    # the all-to-all are judged again, against issue 16's figures, in target_rows.
    del prop_ok, mesh_ok, scale_ok, rss_ok, idle_ok, start_ok, a2a_ok
    p50_now = dig(results, "propagation", "by_size", "8", "steady", "p50")
    verdicts = [
        ("throughput ≥ 0.97 × hand-configured wireguard-go", data_ok),
        ("≥ 10× faster than the launcher of today to all ranks connected", launch_ok),
        ("no claim or probe lost when an etcd member is killed, frozen or partitioned", faults_ok),
        ("1024 ranks, through a cache: etcd events ≤ 1/10 and etcd CPU ≤ 1/5 of direct "
         "watches", fanout_ok),
        ("1024 ranks started at once ≤ 3 s and 10,000 ≤ 10 s on a cluster, through a cache "
         "(scale model)", model_ok),
        ("24 pods, lazy pairs: handshakes started ≤ N × (fan-out + 2), the all-to-all no "
         "slower than the eager arm", lazy_ok),
        (f"steady propagation at 8 pods, p50 (pooled), no worse than on the page as issue 46 "
         f"was filed ({ISSUE46_P50_MS} ms, commit 748477a): {num(p50_now)} ms",
         None if p50_now is None else p50_now <= ISSUE46_P50_MS),
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
        *host_speed_note(results),
        "What a daemon costs, the figures issue 28 set (before: as the issue was filed);",
        "where one is missed, what these runs measured that says why, and how a figure was",
        "taken where that matters:",
        "",
        *table(
            ["figure", "before", "target", "now", "result", "why missed, how measured"],
            [[*row[:4], verdict(met), row[4]] for row, met in cost_rows(results)],
        ),
        *trust_rows(results),
        "Earlier targets:",
        "",
        *targets_table(verdicts),
        *prop,
        *mesh,
        *a2a,
        *lazy,
        *launch,
        *scale,
        *fanout,
        *model,
        *foot,
        *relay_footprint_section(results_dir),
        *start,
        *data,
        *faults,
        *bursting_section(results.get("bursting")),
        *etcd_transport_section(results.get("etcd_transport")),
        *doctor_section(results.get("doctor")),
        *record_proof_section(results.get("record_proof")),
        *kernel_guest_section(results.get("kernel_guest")),
        *kernel_footprint_section(results.get("kernel_footprint")),
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
