"""The ``etcd_transport`` section of docs/benchmarks.md (bench/etcd_transport.py's result)."""

from __future__ import annotations

from common import JSON
from report_format import failures_note, load_note, mmm, table

TRANSPORTS = ("json", "grpc", "grpc-trio")
ROWS = tuple((t, m) for t in TRANSPORTS for m in ("live", "batched"))
LABELS = {
    "json": "JSON gateway",
    "grpc": "gRPC (grpc.aio)",
    "grpc-trio": "gRPC (sync, trio threads)",
}
HEADER = ("transport", "delivery", "events/message", "etcd µs", "client µs", "total µs", "open µs")


def etcd_transport_section(r: JSON | None) -> list[str]:
    out = ["## etcd transport: JSON gateway against native gRPC", ""]
    if r is None:
        return out + ["Not measured (run `bench/etcd_transport.py`).", ""]
    p, s = r["params"], r["summary"]
    rows = [
        [LABELS[transport], mode, mmm(c["events_per_message"], 0), mmm(c["etcd_us_per_event"]),
         mmm(c["client_us_per_event"]), mmm(c["total_us_per_event"]),
         mmm(c["open_us_per_watch"], 0)]
        for transport, mode in ROWS
        if (c := s.get(f"{transport}_{mode}"))
    ]  # fmt: skip
    decision = s.get("decision", {})
    ratios = "; ".join(
        f"{LABELS[t]} " + ", ".join(f"{mode} {ratio:.2f}" for mode, ratio in by_mode.items())
        for t, by_mode in decision.get("over_json_total", {}).items()
    )
    out += [
        f"{'/'.join(map(str, p['watchers']))} watchers (one connection each) in one pod, "
        f"{p['puts']} member records written at {p['rate']:g}/s, one real etcd 3.4. *live*:",
        "the watches are up to date before the puts (one event per message); *batched*: the",
        "watches open from before the puts, as a storm resume does (the client figure",
        "includes that open). CPU per delivered event in µs, median (min–max) over runs;",
        "*open* is the client's CPU to open one watch (batched: with the first events).",
        "",
        *table(HEADER, rows),
        f"Total / JSON total: {ratios or '–'} (the rule for adopting gRPC: ≤ 0.5; "
        'the decision and why are in docs/architecture.md, "etcd transport"). '
        f"Load: {load_note(r)}.",
        "",
    ]
    return out + failures_note(r)
