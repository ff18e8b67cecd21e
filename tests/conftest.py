"""Fixtures for every suite."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """Tests that call ``vnetd.cli.main`` point the root logger at that test's
    captured stderr; put pytest's handlers back so later tests do not log
    into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
