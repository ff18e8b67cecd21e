"""Fixtures of the unit tests; helpers they import are in ``shared.py``.

Virtual time comes from pytest-trio's own ``autojump_clock`` fixture
(``trio.testing.MockClock(autojump_threshold=0)``): a test that names it runs
with a clock that jumps ahead whenever every task is waiting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SPEC_TEXT = """
[mesh]
name = "unit"
size = 4
network = "10.250.0.0/16"
hostname = "unit-{rank}"
[registry]
endpoints = ["http://127.0.0.1:1"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A four-rank spec file whose registry nobody answers (``http://127.0.0.1:1``)."""
    path = tmp_path / "mesh.toml"
    path.write_text(SPEC_TEXT)
    return path
