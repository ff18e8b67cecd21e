"""The benchmark page's section on watch fan-out (``bench/watch_fanout.py``): etcd directly
against a cache between etcd and the watchers (etcd's grpc-proxy, a vnetd relay)."""

from __future__ import annotations

from common import JSON
from report_format import failures_note, load_note, mmm, num, table, verdict

ARMS = {
    "writes": "no watcher (the registrations alone)",
    "claims": "no watcher, N claims (a lease grant and a create each)",
    "direct-json": "direct, JSON gateway (the daemons today)",
    "direct-grpc": "direct, gRPC",
    "direct-vnetd-grpc": "direct, the daemon's gRPC watch",
    "proxy": "etcd grpc-proxy, gRPC",
    "proxy-vnetd-grpc": "etcd grpc-proxy, the daemon's gRPC watch",
    "relay": "vnetd relay, JSON",
}
HEADER = ("arm", "etcd watches", "events etcd delivered", "etcd watch messages",
          "etcd CPU-s", "etcd µs per event", "cache CPU-s", "cache µs per record",
          "watchers' CPU-s", "registrations s", "first registration → all hold N, s")  # fmt: skip


def fanout_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## Watch fan-out: etcd directly against a cache", ""]
    if r is None:
        return out + ["Not measured (run `bench/watch_fanout.py`).", ""], None
    p, s = r["params"], r["summary"]
    rows = [
        [ARMS[name], mmm(v["etcd_watches"], 0), mmm(v["etcd_events"], 0),
         mmm(v["etcd_watch_messages"], 0), mmm(v["etcd_cpu_s"], 2), mmm(v["etcd_us_per_event"]),
         mmm(v["cache_cpu_s"], 2), mmm(v["cache_us_per_record"], 1), mmm(v["watcher_cpu_s"], 2),
         mmm(v["register_s"], 2), mmm(v["formation_s"], 2)]
        for name in ARMS
        if (v := s["by_arm"].get(name))
    ]  # fmt: skip
    met = _met(s) if p["size"] >= 1024 else None
    skipped = "" if "relay" in p["arms"] else (
        " The relay arm was skipped: no `vnetd relay` command existed when it ran "
        "(the bench runs it as soon as one does)."
    )  # fmt: skip
    out += [
        f"{p['size']} ranks register at once (member records put back to back, 32 in",
        f"flight) while {p['watchers']} watchers hold a watch on the members prefix, one",
        "connection each; the arms run one after another in the same lab, each on a fresh",
        f"prefix. etcd 3.4 is pinned to core {p['etcd_core']}; the watchers, the",
        f"registering process, the cache and the bench share core {p['bench_core']}",
        "(`taskset`; nothing else on the machine is pinned). *etcd watches*: watches etcd",
        "held on the prefix; *events etcd delivered*: its `etcd_debugging_mvcc_events_total`",
        "over the storm; *CPU-s*: from the first registration until every watcher held all",
        "N, less the process's own at-rest rate times that window (the rate taken just",
        f"before, over {p['rest_s']:g} s in a first run and over the arm's previous window,",
        "up to 60 s, in a later one); *etcd µs per event*: that, less the registrations'",
        "own cost (the first arm), over the events delivered; *cache µs per record*: the",
        "cache's CPU over the records it forwarded (watchers × N). Median (min–max) over",
        "runs.",
        "",
        *table(HEADER, rows),
        *_ratios(s, p),
        f"Load: {load_note(r)}.{skipped}",
        "",
        "Which watchers grpc-proxy coalesces (etcd v3.4 `proxy/grpcproxy/watch_broadcast*.go`):",
        "those on the same key range whose next wanted revision is not older than the",
        "running broadcast's; a watcher that is behind (a resume from an older revision) gets",
        "an etcd watch of its own until it has caught up, and is merged then only into a",
        "broadcast of fewer than 5 receivers. It serves gRPC only (no JSON gateway), ignores",
        "progress requests, and asks etcd for every change's previous value. Here the",
        "watchers open on one range from one revision, so they share one etcd watch.",
        "",
    ]
    return out + failures_note(r), met


def _met(s: JSON) -> bool | None:
    """The issue's rule at 1024 ranks: a cache arm with ≤ 1/10 of the direct arm's events
    and ≤ 1/5 of its etcd CPU (against the daemons' direct arm of today, JSON)."""
    found = [v for key, v in s["ratios"].items() if key.endswith("/direct-json")]
    if not found:
        return None
    events, cpu = s["target_events_ratio"], s["target_etcd_cpu_ratio"]
    return any(v["events"] <= events and v["etcd_cpu"] <= cpu for v in found)


def _ratios(s: JSON, p: JSON) -> list[str]:
    if not s["ratios"]:
        return ["No cache arm and direct arm both measured: no ratio.", ""]
    parts = [
        f"{key.replace('/', ' over ')}: events {num(v['events'], 3)}, "
        f"etcd CPU {num(v['etcd_cpu'], 2)}"
        for key, v in s["ratios"].items()
    ]
    rule = (f"Target at 1024 ranks: a cache arm's events ≤ {s['target_events_ratio']:g} and "
            f"etcd CPU-s ≤ {s['target_etcd_cpu_ratio']:g} of the direct arm's (the daemons' "
            "JSON path) — ")  # fmt: skip
    judged = verdict(_met(s)) if p["size"] >= 1024 else f"not judged at {p['size']} ranks"
    lines = ["Ratios (medians): " + "; ".join(parts) + ".", "", rule + judged + ".", ""]
    proxy, relay = (s["by_arm"].get(k, {}).get("cache_us_per_record", {}).get("median")
                    for k in ("proxy", "relay"))  # fmt: skip
    if proxy is not None and relay is not None:
        lines += [f"Per record forwarded, grpc-proxy spent {proxy:.1f} µs and the vnetd relay "
                  f"{relay:.1f} µs ({relay / proxy:.2f}× the proxy's); etcd delivered each "
                  "registration once to either.", ""]  # fmt: skip
    return lines
