"""What ``vnetd doctor`` prints: the reach matrix, the failing pairs, the JSON document.

Pure: it takes the verdicts ``vnetd.doctor.cause`` gave and returns text or a
JSON-ready document. The matrix is drawn up to ``MATRIX_LIMIT`` ranks and
summarised per rank beyond; failing pairs are listed one per line up to
``LIST_LIMIT`` and grouped by cause and rank beyond. The JSON schema is
documented in docs/operations.md ("Troubleshooting").
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vnetd.doctor.cause import CAUSES, OVERLOADED, Verdict

SCHEMA = "vnetd-doctor/1"
MATRIX_LIMIT = 64
LIST_LIMIT = 48


@dataclass(frozen=True)
class Run:
    """One run's result."""

    mesh: str
    size: int
    registered: tuple[int, ...]
    answered: tuple[int, ...]
    verdicts: tuple[Verdict, ...]
    elapsed: float
    notes: tuple[str, ...] = ()

    @property
    def failing(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    @property
    def ok(self) -> bool:
        return not self.failing


def matrix_lines(size: int, verdicts: Sequence[Verdict]) -> list[str]:
    """The N×N matrix (row reaches column: ``#`` direct, ``g`` via a gateway, ``.`` no,
    ``?`` not judged: a daemon was overloaded)."""
    cell = {(v.source, v.target): _cell(v) for v in verdicts}
    lines = ["reach matrix (row reaches column; # direct, g via gateway, . no, ? overloaded):"]
    lines.append("      " + "".join(f"{b % 10}" for b in range(size)))
    for a in range(size):
        cells = "".join(" " if a == b else cell.get((a, b), "?") for b in range(size))
        lines.append(f"  {a:3d} {cells}")
    return lines


def _cell(verdict: Verdict) -> str:
    if verdict.ok:
        return "g" if verdict.via is not None else "#"
    return "?" if verdict.cause == OVERLOADED else "."


def per_rank_lines(size: int, verdicts: Sequence[Verdict]) -> list[str]:
    """Beyond ``MATRIX_LIMIT``: the ranks with failing pairs, with their counts."""
    out: Counter[int] = Counter(v.source for v in verdicts if not v.ok)
    into: Counter[int] = Counter(v.target for v in verdicts if not v.ok)
    bad = sorted(set(out) | set(into))
    lines = [f"reach summary: {size} ranks, {len(bad)} with failing pairs"]
    for rank in bad[:LIST_LIMIT]:
        lines.append(f"  rank {rank}: fails to reach {out[rank]}, not reached by {into[rank]}")
    if len(bad) > LIST_LIMIT:
        lines.append(f"  … and {len(bad) - LIST_LIMIT} more ranks")
    return lines


def failing_lines(verdicts: Sequence[Verdict]) -> list[str]:
    failing = [v for v in verdicts if not v.ok]
    if not failing:
        return []
    if len(failing) <= LIST_LIMIT:
        return ["failing pairs:"] + [
            f"  {v.source:>4} → {v.target:<4} {v.cause}: {v.detail}" for v in failing
        ]
    lines = ["failing pairs, by cause (one example each):"]
    groups: dict[str, list[Verdict]] = {}
    for v in failing:
        groups.setdefault(v.cause, []).append(v)
    for cause in CAUSES:
        group = groups.get(cause)
        if group:
            first = group[0]
            lines.append(
                f"  {cause}: {len(group)} pairs, e.g. {first.source} → {first.target}: "
                f"{first.detail}"
            )
    return lines


def working_line(verdicts: Sequence[Verdict]) -> str:
    good = [v for v in verdicts if v.ok]
    if not good:
        return "working pairs: none"
    via = sum(v.via is not None for v in good)
    rtts = [v.rtt * 1000 for v in good if v.rtt is not None]
    mtus = sorted({v.path_mtu for v in good if v.path_mtu is not None})
    rtt = f"rtt median {statistics.median(rtts):.2f} ms, max {max(rtts):.2f} ms" if rtts else ""
    mtu = f"path mtu {', '.join(map(str, mtus))}" if mtus else ""
    parts = [f"{len(good) - via} direct", f"{via} via gateway", rtt, mtu]
    return f"working pairs: {len(good)} ({', '.join(p for p in parts if p)})"


def text(run: Run) -> str:
    lines = [
        f"vnetd doctor: mesh {run.mesh}, {run.size} ranks, {len(run.registered)} registered, "
        f"{len(run.answered)} probe services answered, {run.elapsed:.1f} s"
    ]
    if run.size <= MATRIX_LIMIT:
        lines += matrix_lines(run.size, run.verdicts)
    else:
        lines += per_rank_lines(run.size, run.verdicts)
    lines += failing_lines(run.verdicts)
    lines.append(working_line(run.verdicts))
    lines += [f"note: {note}" for note in run.notes]
    total, failing = len(run.verdicts), len(run.failing)
    unjudged = sum(v.cause == OVERLOADED for v in run.failing)
    lines.append(
        f"all {total} ordered pairs reach each other"
        if not failing
        else f"{failing} of {total} ordered pairs fail"
        + (f" ({unjudged} not judged: overloaded daemons, run again)" if unjudged else "")
    )
    return "\n".join(lines) + "\n"


def document(run: Run) -> dict[str, Any]:
    """The ``--json`` document (schema ``vnetd-doctor/1``, docs/operations.md)."""
    return {
        "schema": SCHEMA,
        "mesh": run.mesh,
        "size": run.size,
        "ok": run.ok,
        "elapsed_s": round(run.elapsed, 3),
        "registered": list(run.registered),
        "answered": list(run.answered),
        "causes": dict(Counter(v.cause for v in run.failing)),
        "failing": [
            {"from": v.source, "to": v.target, "cause": v.cause, "detail": v.detail,
             "via": v.via, "largest": v.path_mtu}
            for v in run.failing
        ],
        "working": [
            [v.source, v.target, v.via,
             None if v.rtt is None else round(v.rtt * 1000, 3), v.path_mtu]
            for v in run.verdicts if v.ok
        ],
        "notes": list(run.notes),
    }  # fmt: skip
