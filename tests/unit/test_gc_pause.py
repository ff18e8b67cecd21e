"""The collector paused for ``vnetd up``'s start (``vnetd.gc_pause``): only a pause made
there is resumed, every way out of the CLI resumes it, and the daemon resumes it
once it has claimed its rank."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio
from test_daemon import Cluster

from vnetd import gc_pause
from vnetd.cli import main
from vnetd.commands import address_plan


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector, the next one finds it on."""
    yield
    gc_pause._paused = False
    gc.unfreeze()
    gc.enable()


def test_pause_then_resume(collector):
    gc_pause.pause()
    assert not gc.isenabled()
    gc_pause.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def test_a_command_resumes_without_freezing(collector):
    gc.unfreeze()
    gc_pause.pause()
    gc_pause.resume(freeze=False)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_collector_turned_off_elsewhere_stays_off(collector):
    gc.disable()
    gc_pause.pause()
    gc_pause.resume()
    assert not gc.isenabled()


def test_a_failed_up_resumes_the_collector(collector, tmp_path, capsys):
    assert main(["up", "--config", str(tmp_path / "missing.toml")]) == 2
    assert gc.isenabled()
    assert "missing.toml" in capsys.readouterr().err


def test_another_command_runs_with_the_collector_on(collector, monkeypatch):
    """``python -m vnetd`` pauses before the CLI's imports; a command other than ``up``
    resumes at once instead of running without collections."""
    seen: list[bool] = []
    monkeypatch.setattr(address_plan, "run", lambda _args: seen.append(gc.isenabled()) or 0)
    gc_pause.pause()
    assert main(["plan", "--config", "mesh.toml"]) == 0
    assert seen == [True]


def test_python_m_vnetd_pauses_before_the_cli_is_imported():
    code = (
        "import gc, sys\n"
        "sys.argv = ['vnetd', 'up', '--help']\n"
        "import vnetd.cli\n"
        "vnetd.cli.main = lambda: print(gc.isenabled()) or 0\n"
        "import runpy\n"
        "try:\n"
        "    runpy.run_module('vnetd', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False"]


async def test_the_daemon_resumes_the_collector_once_claimed(collector, tmp_path, autojump_clock):
    gc_pause.pause()
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        running = await cluster.start(0)
        assert not gc.isenabled()  # started: the claim is under way, not made
        with trio.fail_after(5):
            await running.claim.claimed.wait()
            while not gc.isenabled():
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
