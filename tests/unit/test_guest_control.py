"""``vnetd.lab.guest.GuestControl``: the priority and the end of a guest run that another
thread steers (the suite's guest runs beside the host tests, ``tests/kernel_guest.py``).

A ``sleep`` child stands in for QEMU: what is checked is the real renice of
every thread of a real process, and the real kill by pid when a run is stopped,
not the boot (which ``tests/contract`` and ``tests/e2e`` run in the guest).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vnetd.lab.guest import GuestControl, _boot_and_wait
from vnetd.lab.guest_image import GuestUnavailable


def niceness(pid: int) -> set[int]:
    """The niceness of every thread of ``pid``."""
    return {
        os.getpriority(os.PRIO_PROCESS, int(task.name))
        for task in Path(f"/proc/{pid}/task").iterdir()
    }


def children() -> set[int]:
    """The pids of this process's children (those still not reaped included)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found |= {int(pid) for pid in (task / "children").read_text().split()}
    return found


@pytest.fixture
def child() -> subprocess.Popen[bytes]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()  # by its pid: this test's own child
    process.wait(10)


def test_the_niceness_applies_at_the_boot_and_follows_a_renice(child):
    if os.geteuid() != 0:
        pytest.skip("lowering a niceness again needs root")
    control = GuestControl(nice=5)
    assert niceness(child.pid) == {0}, "the boot runs at full priority"
    control._booted(child.pid)
    assert niceness(child.pid) == {5}
    control.renice(0)
    assert niceness(child.pid) == {0}
    control._ending()
    control.renice(7)  # after the end: the pid may be another process's by now
    assert niceness(child.pid) == {0}


def test_a_renice_before_the_boot_is_what_the_boot_applies(child):
    control = GuestControl(nice=5)
    control.renice(3)
    assert niceness(child.pid) == {0}
    control._booted(child.pid)
    assert niceness(child.pid) == {3}


def test_a_stopped_run_kills_its_process_and_says_so(tmp_path):
    """Stopped from another thread while it waits for the boot: the process (``sleep``
    in QEMU's place) is killed and reaped, and the error names the stop."""
    before = children()
    control = GuestControl()
    timer = threading.Timer(0.3, control.stop.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(GuestUnavailable, match="stopped by its caller"):
        _boot_and_wait(["sleep", "60"], tmp_path, tmp_path / "console", (), 60.0, 60.0, control)
    timer.join()
    assert time.monotonic() - started < 30.0  # the 60 s boot bound was not waited out
    assert children() - before == set(), "the stopped run left its process"


def test_a_stop_after_the_boot_ends_the_command_wait(tmp_path):
    """Booted (the share's ``booted`` file), then stopped while the command runs."""
    (tmp_path / "booted").touch()
    before = children()
    control = GuestControl(nice=5)
    timer = threading.Timer(0.3, control.stop.set)
    timer.start()
    with pytest.raises(GuestUnavailable, match="command was stopped"):
        _boot_and_wait(["sleep", "60"], tmp_path, tmp_path / "console", (), 60.0, 60.0, control)
    timer.join()
    assert children() - before == set(), "the stopped run left its process"
