"""The entry point: a closed output pipe, and what building the parsers imports."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vnetd.cli import main
from vnetd.status.table import plain_console

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "mesh.toml"


def vnetd_env(*, unbuffered: bool) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "block-buffered"])
def test_a_reader_gone_before_the_first_line_ends_plan_quietly(unbuffered: bool) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "vnetd", "plan", "--config", str(EXAMPLE)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=vnetd_env(unbuffered=unbuffered),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == b""
    assert result.returncode == 141


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "block-buffered"])
def test_plan_into_head_3_ends_quietly(tmp_path: Path, unbuffered: bool) -> None:
    """``vnetd plan | head -3`` with a plan larger than the pipe holds, so the
    command is still writing when the reader leaves."""
    config = tmp_path / "big.toml"
    config.write_text('[mesh]\nname = "big"\nsize = 60000\nnetwork = "10.0.0.0/8"\n')
    with subprocess.Popen(
        [sys.executable, "-m", "vnetd", "plan", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=vnetd_env(unbuffered=unbuffered),
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        head = [child.stdout.readline() for _ in range(3)]
        child.stdout.close()
        err = child.stderr.read()
        code = child.wait(timeout=60)
    assert head[1] == b"0\t10.0.0.1\tbig-0\n"
    assert err == b""
    assert code == 141


def test_the_status_table_leaves_a_closed_pipe_to_the_entry_point() -> None:
    """rich's console would exit 1 by itself (``vnetd wait``'s "timed out")."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as pipe:
        with pytest.raises(BrokenPipeError):
            plain_console(pipe).print("rank 0")
        with contextlib.suppress(BrokenPipeError):
            pipe.close()


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("vnetd.commands.address_plan.run", broken)
    with pytest.raises(BrokenPipeError):
        main(["plan", "--config", str(EXAMPLE)])


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
