"""PLACEHOLDER: the helper replaces this with the ``wait`` subcommand."""

from __future__ import annotations

from typing import Any


def add_parser(sub: Any) -> None:  # noqa: ANN401
    del sub
