"""Rank sets on the command line: ``all``, ``5``, ``0-7``, ``0,3,5-9``; and back to text.

Pure: ``parse_ranks`` checks every item against the mesh size before it
expands anything, so ``0-99999999999`` is an error, not a huge allocation.
``format_ranks`` is its inverse for messages, with long lists capped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vnetd.errors import SpecError

_ITEM = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)
_SHOWN = 24  # characters of a bad item echoed in a message
FORMAT_GROUPS = 8  # groups shown by format_ranks before it elides the rest


def parse_ranks(text: str, size: int, flag: str = "--ranks") -> tuple[int, ...]:
    """The ranks ``text`` names, sorted and without duplicates.

    Args:
        text: ``all``, a rank (``5``), a range (``0-7``) or a comma-separated
            list of those (``0,3,5-9``); spaces around items are ignored.
        size: the mesh size; valid ranks are ``0..size-1``.
        flag: the option the text came from, named in errors.

    Raises:
        SpecError: the message names ``flag``, the bad part and the valid range.
    """
    if size < 1:
        raise ValueError(f"mesh size must be positive, got {size}")
    usage = f"use all, 5, 0-7 or 0,3,5-9 (the ranks of this mesh are 0..{size - 1})"
    if not text.strip():
        raise SpecError(f"{flag}: empty; {usage}")
    if text.strip().lower() == "all":
        return tuple(range(size))
    spans = sorted(_span(item, text, flag, size, usage) for item in text.split(","))
    ranks: list[int] = []
    for first, last in spans:  # merged, so overlapping items never expand twice
        start = max(first, ranks[-1] + 1) if ranks else first
        ranks.extend(range(start, last + 1))
    return tuple(ranks)


def _span(item: str, text: str, flag: str, size: int, usage: str) -> tuple[int, int]:
    """One item checked against ``size``: ``(first, last)``, inclusive."""
    item = item.strip()
    if not item:
        raise SpecError(f"{flag}: {_shown(text)} has an empty item; {usage}")
    match = _ITEM.fullmatch(item)
    if match is None:
        if item[0] in "+-":
            raise SpecError(f"{flag}: {_shown(item)} has a sign; ranks are unsigned; {usage}")
        raise SpecError(f"{flag}: {_shown(item)} is not a rank or a range; {usage}")
    first = _rank(match.group(1), item, flag, size)
    last = first if match.group(2) is None else _rank(match.group(2), item, flag, size)
    if last < first:
        raise SpecError(
            f"{flag}: {item!r} is a reversed range; write {last}-{first} "
            f"(the ranks of this mesh are 0..{size - 1})"
        )
    return first, last


def _rank(digits: str, item: str, flag: str, size: int) -> int:
    """``digits`` as a rank below ``size``; long numbers are refused before ``int()``."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(size - 1)) or int(significant) >= size:
        where = "" if digits == item else f" in {_shown(item)}"
        raise SpecError(
            f"{flag}: rank {_shorter(significant)}{where} is out of range; "
            f"the ranks of this mesh are 0..{size - 1}"
        )
    return int(significant)


def _shown(text: str) -> str:
    """``text`` quoted for a message, shortened when long."""
    return repr(text) if len(text) <= _SHOWN else f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def _shorter(digits: str) -> str:
    return digits if len(digits) <= _SHOWN else f"{digits[:_SHOWN]}... ({len(digits)} digits)"


def format_ranks(ranks: Iterable[int], limit: int = FORMAT_GROUPS) -> str:
    """Ranks as compact text: ``0-3, 5, 7-9``; past ``limit`` groups ``... (N in all)``.

    Args:
        ranks: any order, duplicates allowed.
        limit: the most groups (single ranks or ranges) written out.
    """
    groups = _groups(sorted(set(ranks)))
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in groups[:limit]]
    if len(groups) > limit:
        total = sum(b - a + 1 for a, b in groups)
        parts.append(f"... ({total} in all)")
    return ", ".join(parts)


def _groups(ranks: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive ranks as ``(first, last)``; a run of two is two singles."""
    runs: list[tuple[int, int]] = []
    for rank in ranks:
        if runs and runs[-1][1] == rank - 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    groups: list[tuple[int, int]] = []
    for first, last in runs:
        groups += [(first, first), (last, last)] if last == first + 1 else [(first, last)]
    return groups
