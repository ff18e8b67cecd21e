"""The relay's footprint section of docs/benchmarks.md (bench/relay_footprint.py's result):
one ``vnetd relay`` holding an N-member mesh and serving W simulated daemons."""

from __future__ import annotations

from pathlib import Path

from common import read_result
from report_format import failures_note, load_note, mmm, table


def relay_footprint_section(results_dir: Path) -> list[str]:
    out = ["## Footprint of one relay", ""]
    r = read_result("relay_footprint", results_dir)
    if r is None:
        return out + ["Not measured (run `bench/relay_footprint.py`).", ""]
    s, p = r["summary"], r["params"]
    n, w, k = p["size"], p["watchers"], p["updates"]
    rows = [
        ["empty (no member): the interpreter and its imports", mmm(s["empty_rss_mib"]),
         mmm(s["empty_pss_mib"]), f"{mmm(s['empty_start_cpu_s'], 2)} to start"],
        [f"holding {n} members (one list of etcd)", mmm(s["members_rss_mib"]),
         mmm(s["members_pss_mib"]), f"{mmm(s['list_cpu_s'], 2)} more to list them"],
        [f"serving {w} daemons' lists and watches", mmm(s["watchers_rss_mib"]),
         mmm(s["watchers_pss_mib"]), f"{mmm(s['lists_cpu_s'], 2)} for the {w} lists"],
        [f"after forwarding {k} changes to each", mmm(s["after_rss_mib"]), "",
         f"{mmm(s['forward_cpu_s'], 2)} for {w * k} records"],
    ]  # fmt: skip
    return out + [
        f"One `vnetd relay` in a lab pod, holding the members prefix of a {n}-rank mesh",
        f"(records of about {mmm(s['record_bytes'], 0)} bytes put straight into etcd) and",
        f"serving {w} simulated daemons (the daemon's own `EtcdRegistry`, one connection",
        "each): each lists the members from the relay, then watches it; then "
        f"{k} records are rewritten in etcd and every watcher takes all {k}.",
        "etcd on a core of its own, the relay and the watchers on the other",
        "(`bench/relay_footprint.py`); the relay's CPU from its threads' schedstat.",
        "MiB and CPU-s, median (min–max) over runs. The list's CPU is the start with the",
        "members less the median of three empty starts (the imports alone vary by a few",
        "tens of ms from start to start, as much as the list).",
        "",
        *table(["relay", "RSS", "PSS", "CPU-s"], rows),
        f"Per member held: {mmm(s['members_kib_per_member'], 2, unit=' KiB')} resident. "
        f"Per record served in the daemons' lists: {mmm(s['us_per_record_listed'], 1)} µs. "
        f"Per record forwarded to a watcher: {mmm(s['us_per_record_forwarded'], 1)} µs of "
        "relay CPU (its at-rest rate over the window taken off). At rest, relay CPU: "
        f"{mmm(s['rest_share_members'], 2, 100, ' %')} of a core holding the members, "
        f"{mmm(s['rest_share_watchers'], 2, 100, ' %')} with the {w} watches "
        f"(over {p['rest_s']:g} s each). Load: {load_note(r)}.",
        "",
        *failures_note(r),
    ]
