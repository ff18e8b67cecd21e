"""Fixtures of the render tests: the golden-file check and spec files in tmp_path.

Golden files live in ``golden/`` beside these tests and are compared byte
for byte. To regenerate them after an intended change of output, run

    VNETD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/render

and review the diff before committing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from render_fixtures import DUAL_TOML, GOLDEN, LAB6_TOML, LAB_TOML


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """``golden(name, text)``: assert ``text`` equals ``golden/name`` byte for byte."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if os.environ.get("VNETD_UPDATE_GOLDEN") == "1":
            path.write_bytes(text.encode())
            return
        assert path.exists(), f"{path} is missing: run with VNETD_UPDATE_GOLDEN=1 to create it"
        assert text.encode() == path.read_bytes(), (
            f"{name} differs; VNETD_UPDATE_GOLDEN=1 rewrites it"
        )

    return check


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
