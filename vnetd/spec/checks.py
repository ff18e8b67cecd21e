"""The type and range checks every table of a spec goes through (``spec.parse``).

Each raises ``SpecError`` naming the key (``table.key``) and what was expected, so a
spec's mistakes read the same whichever table they are in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vnetd.errors import SpecError


def spec_table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        raise SpecError(f"{name}: expected a table [{name}], got {kind(table)}")
    return table


def check_keys(table: str, values: Mapping[str, Any], known: Mapping[str, type]) -> None:
    for key, value in values.items():
        if key not in known:
            raise SpecError(f"{table}.{key}: unknown key (known: {', '.join(sorted(known))})")
        expected = known[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise SpecError(f"{table}.{key}: expected {TYPE_NAMES[expected]}, got {kind(value)}")


TYPE_NAMES: dict[type, str] = {str: "a string", int: "an integer", list: "an array",
                                 Mapping: "a table"}  # fmt: skip


def kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "a table"
    for typ, name in TYPE_NAMES.items():
        if isinstance(value, typ):
            return name
    return type(value).__name__


def int_in(key: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise SpecError(f"{key}: {value} is out of range ({low}..{high})")
    return value
