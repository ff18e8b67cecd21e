"""Issue 44's cost rows of docs/benchmarks.md: what checking records costs one daemon
taking 1023 joins (``bench/join_storm.py``), in a mesh of signed records and in one
that pins ``[mesh] rank_ca`` (``--rank-ca``, result ``join_storm_rank_ca``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from common import JSON
from report_format import table, verdict

ARMS = (("join_storm", "signed records"), ("join_storm_rank_ca", "rank certificates"))
"""The results, and what each arm's column says its records carry."""


class TrustTarget(NamedTuple):
    figure: str
    before: str
    limit: float
    """Seconds."""
    of_run: Callable[[JSON], float]
    """The figure of one run."""
    detail: Callable[[JSON], str] = lambda run: ""
    """What the figure of one run is made of, where it says more than its total."""


def _checks(run: JSON) -> float:
    return float(run["proofs_cpu_s"]) + float(run.get("certs_cpu_s", 0.0))


def _checks_split(run: JSON) -> str:
    certs = run.get("certs_verified", 0)
    if not certs:
        return ""
    return (f" (signatures {_shown(run['proofs_cpu_s'])}, {certs} certificates "
            f"{_shown(run['certs_cpu_s'])})")  # fmt: skip


TARGETS = (
    TrustTarget("checking the records (signatures, and certificates where pinned): one "
                "daemon's CPU to take 1023 joins (join storm), every run", "102 ms", 0.025,
                _checks, _checks_split),
    TrustTarget("one daemon's CPU to take 1023 joins (join storm), every run", "0.44 s", 0.44,
                lambda run: float(run["cpu_s"])),
)  # fmt: skip


def _worst(result: JSON | None, target: TrustTarget) -> JSON | None:
    """The run whose figure is the worst, or None: not measured, or no run of 1023 joins."""
    runs = [run for run in (result or {}).get("runs", []) if run.get("joins") == 1023]
    return max(runs, key=target.of_run, default=None)


def _shown(seconds: float | None) -> str:
    if seconds is None:
        return "not measured"
    return f"{seconds * 1000:.0f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def trust_rows(results: dict[str, JSON]) -> list[str]:
    """Issue 44's table: a row per figure, a column per arm, each with its verdict."""
    rows = []
    for target in TARGETS:
        cells = []
        for name, _ in ARMS:
            worst = _worst(results.get(name), target)
            now = None if worst is None else target.of_run(worst)
            met = None if now is None else now <= target.limit
            split = "" if worst is None else target.detail(worst)
            cells.append(verdict(None) if now is None else f"{_shown(now)}{split}: {verdict(met)}")
        limit = f"≤ {_shown(target.limit)}"
        rows.append([target.figure, target.before, limit, *cells])
    header = ["figure", "before", "target", *(f"now, {label}" for _, label in ARMS)]
    return [
        "What checking records costs, the figures issue 44 set (before: as the issue was",
        "filed, signed records; `bench/join_storm.py`, and with `--rank-ca` a mesh that",
        "pins `[mesh] rank_ca`, where every first claim's certificate and proof are",
        "checked; the checks are timed in the daemon):",
        "",
        *table(header, rows),
    ]
