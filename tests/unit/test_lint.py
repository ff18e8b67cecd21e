"""The code conventions that tools can check: ruff (lint and format, the whole repository:
the benches and scripts too) and mypy strict (the package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["ruff", "check", "."], id="ruff-check"),
        pytest.param(["ruff", "format", "--check", "."], id="ruff-format"),
        pytest.param(["mypy", "vnetd"], id="mypy-strict"),
    ],
)
def test_tool_passes(argv: list[str]) -> None:
    result = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_test_file_names_are_unique_across_suites() -> None:
    # The suites have no __init__.py, so pytest imports test files by basename:
    # two files with one name stop the whole run at collection.
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
