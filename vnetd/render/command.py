"""PLACEHOLDER: the helper replaces this with the ``render`` and ``hosts`` subcommands."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: Any) -> None:  # noqa: ANN401
    del sub


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
