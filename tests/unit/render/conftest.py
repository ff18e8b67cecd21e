"""Fixtures of the render tests: the golden-file check and spec files in tmp_path.

Golden files live in ``golden/`` beside these tests and are compared byte
for byte. To regenerate them after an intended change of output, run

    VNETD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/render

and review the diff before committing. Each file it rewrites is named at the
end of the run; under ``CI`` (the variable set) the switch fails instead, so a
CI run can never pass by rewriting what it checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from render_fixtures import DUAL_TOML, GOLDEN, LAB6_TOML, LAB_TOML

REWRITTEN = pytest.StashKey[list[str]]()
"""The golden files this run rewrote (``VNETD_UPDATE_GOLDEN=1``), for the summary."""


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(name, text)``: assert ``text`` equals ``golden/name`` byte for byte."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if os.environ.get("VNETD_UPDATE_GOLDEN") == "1":
            if os.environ.get("CI"):
                pytest.fail(
                    "VNETD_UPDATE_GOLDEN=1 under CI: golden files are rewritten only by hand; "
                    "unset VNETD_UPDATE_GOLDEN"
                )
            if not path.exists() or path.read_bytes() != text.encode():
                path.write_bytes(text.encode())
                request.config.stash.setdefault(REWRITTEN, []).append(name)
            return
        assert path.exists(), f"{path} is missing: run with VNETD_UPDATE_GOLDEN=1 to create it"
        assert text.encode() == path.read_bytes(), (
            f"{name} differs; VNETD_UPDATE_GOLDEN=1 rewrites it"
        )

    return check


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    rewritten = terminalreporter.config.stash.get(REWRITTEN, [])
    if os.environ.get("VNETD_UPDATE_GOLDEN") == "1":
        terminalreporter.write_line(
            f"VNETD_UPDATE_GOLDEN=1: rewrote {len(rewritten)} golden file(s)"
            + "".join(f"\n  rewrote {GOLDEN / name}" for name in rewritten)
        )


@pytest.fixture
def lab_config(tmp_path: Path) -> Path:
    path = tmp_path / "lab.toml"
    path.write_text(LAB_TOML)
    return path


@pytest.fixture
def lab6_config(tmp_path: Path) -> Path:
    path = tmp_path / "lab6.toml"
    path.write_text(LAB6_TOML)
    return path


@pytest.fixture
def dual_config(tmp_path: Path) -> Path:
    path = tmp_path / "ds.toml"
    path.write_text(DUAL_TOML)
    return path
