"""The entry point: what building the parsers imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "mesh.toml"


def vnetd_env(*, unbuffered: bool) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize(
    "argv", [["--help"], ["plan", "--config", str(EXAMPLE)]], ids=["help", "plan"]
)
def test_help_and_plan_import_no_io_library(argv: list[str]) -> None:
    script = (
        "import sys\n"
        "from vnetd.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = {'trio', 'httpx', 'pyroute2', 'rich', 'cryptography'} & set(sys.modules)\n"
        "print(sorted(heavy), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        env=vnetd_env(unbuffered=True),
        timeout=60,
        check=False,
    )
    assert result.stderr.decode().strip() == "[]"
