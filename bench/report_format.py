"""What every section of the benchmark page uses: number formats, tables, verdicts, plots.

``report.py`` and its section files (``report_*.py``) import these; none of
them imports ``report.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from common import JSON, ROOT

PLOTS = {"dir": ROOT / "docs" / "benchmarks"}
"""Where the plots go: ``benchmarks/`` beside the document (set by ``render``)."""


# --- formatting -------------------------------------------------------------------------


def num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def mmm(spread: JSON | None, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    """``median (min–max)`` of a spread record; just the value when there is one run."""
    if not spread or spread.get("n", 0) == 0 or spread.get("median") is None:
        return "–"
    med, low, high = (spread[k] * scale for k in ("median", "min", "max"))
    if spread["n"] == 1 or num(low, digits) == num(high, digits):
        return f"{num(med, digits)}{unit}"
    return f"{num(med, digits)}{unit} ({num(low, digits)}–{num(high, digits)})"


def by_size(record: JSON) -> list[tuple[str, JSON]]:
    """A ``by_size`` summary's items, smallest size first."""
    return sorted(record.items(), key=lambda kv: int(kv[0]))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def verdict(ok: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[ok]


def failures_note(result: JSON) -> list[str]:
    """A paragraph listing the runs that failed (they are left out of the tables)."""
    failures = result.get("failures") or []
    if not failures:
        return []
    items = "; ".join(
        ", ".join(f"{k} {v}" for k, v in f.items() if k != "error") + f": {f['error']}"
        for f in failures
    )
    return [f"**{len(failures)} run(s) failed** and are left out of the table: {items}", ""]


def load_note(result: JSON) -> str:
    load = result.get("load", {})
    busy = load.get("cpu_busy_mean")
    foreign = load.get("foreign_lab_netns_max", 0)
    text = f"machine CPU busy {busy:.0%} on average" if busy is not None else "load not recorded"
    if foreign:
        text += (
            f"; **other lab tests ran at the same time** (up to {foreign} foreign lab "
            "namespaces), so these figures are pessimistic"
        )
    else:
        text += "; nothing else ran in a lab meanwhile"
    return text


# --- plots ------------------------------------------------------------------------------


def plot(name: str, draw: Callable[[Any], None], size: tuple[float, float] = (7, 4)) -> str:
    """Draw with matplotlib into ``docs/benchmarks/<name>.png``; the markdown image line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS["dir"].mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=size, dpi=110)
    draw(ax)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOTS["dir"] / f"{name}.png")
    plt.close(fig)
    return f"![{name}](benchmarks/{name}.png)"


def cdf(
    ax: Any,  # noqa: ANN401 - a matplotlib Axes
    values: Sequence[float],
    label: str,
    style: str = "-",
    color: str | None = None,
) -> None:
    ordered = sorted(values)
    if ordered:
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, style, label=label, color=color)
