"""The ``record_proof`` section of docs/benchmarks.md (bench/record_proof.py's result)."""

from __future__ import annotations

from common import JSON
from report_format import table


def record_proof_section(r: JSON | None) -> list[str]:
    out = ["## Signed member records: size and CPU per join", ""]
    if r is None:
        return out + ["Not measured (run `bench/record_proof.py`).", ""]
    s, load = r["summary"], r["load"]

    def row(what: str, unsigned: float, signed: float, unit: str) -> list[str]:
        more = round(signed - unsigned, 2)
        return [what, f"{unsigned:g} {unit}", f"{signed:g} {unit}", f"{more:+g}"]

    rows = [
        row("record size", s["unsigned_bytes"], s["signed_bytes"], "B"),
        row("encode (a claim or record update)", s["encode_unsigned_us"], s["encode_signed_us"],
            "µs"),
        row("decode (each reader, per record)", s["decode_unsigned_us"], s["decode_signed_us"],
            "µs"),
        row("one join event into a reader's view", s["join_event_unsigned_us"],
            s["join_event_signed_us"], "µs"),
        row(f"a list of {s['size']} members into a fresh view", s["list_unsigned_ms"],
            s["list_signed_ms"], "ms"),
        row("the same list again (a re-list)", s["relist_unsigned_ms"], s["relist_signed_ms"],
            "ms"),
    ]  # fmt: skip
    return out + [
        "Each daemon signs its member record with its Ed25519 record signing key and every",
        "reader verifies the signature once per record it has not verified before",
        '(docs/security.md, "Within one credential"). `bench/record_proof.py`, pure Python',
        "with no lab: CPU time of the process (`time.process_time`), the median of",
        f"{r['params']['rounds']} rounds of {r['params']['repeat']} calls (load average "
        f"{load['loadavg_1m_before']:.0f} before, {load['loadavg_1m_after']:.0f} after).",
        "",
        *table(["", "unsigned", "signed", "difference"], rows),
        "A signed join costs each reader one Ed25519 verification more (libsodium's, through",
        "PyNaCl; results from before 2026-12-04 are cryptography's, about twice the CPU); a",
        "re-list verifies only records it has not verified at that key and lease. CPU time is",
        "less disturbed",
        "by a loaded machine than wall time, not immune to it (shared caches and cores).",
        "",
    ]
