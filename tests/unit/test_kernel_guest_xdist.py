"""``tests/kernel_guest.py`` under pytest-xdist: one guest for the whole run, the
controller's. A worker that booted its own (as each of two workers did until this
test, beside the controller's: three TCG guests on two cores) starves every test.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import kernel_guest
import pytest


class Recorder:
    """Stands in for ``BackgroundGuest``: what would have booted."""

    started: list[list[str]] = []

    def __init__(self, ids: list[str], rootpath: Path, **_: object) -> None:
        self.ids = ids

    def start(self) -> None:
        Recorder.started.append(self.ids)

    def stop(self) -> None:
        pass


class Case:
    """Stands in for ``GuestCase``."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def session(tmp_path: Path, *, worker: bool) -> SimpleNamespace:
    config = SimpleNamespace(
        pluginmanager=SimpleNamespace(has_plugin=lambda name: False),
        option=SimpleNamespace(collectonly=False, continue_on_collection_errors=False),
        rootpath=tmp_path,
        stash={},
    )
    if worker:
        config.workerinput = {kernel_guest.RUN_DIR_INPUT: str(tmp_path)}
    return SimpleNamespace(config=config, items=[Case("a::kernel")], testsfailed=0)


@pytest.fixture(autouse=True)
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    Recorder.started = []
    monkeypatch.setattr(kernel_guest, "BackgroundGuest", Recorder)
    monkeypatch.setattr(kernel_guest, "GuestCase", Case)


def test_an_xdist_worker_boots_no_guest_of_its_own(tmp_path):
    with kernel_guest.guest_in_background(session(tmp_path, worker=True)):
        pass
    assert Recorder.started == []


def test_a_run_without_xdist_boots_its_guest_once(tmp_path):
    with kernel_guest.guest_in_background(session(tmp_path, worker=False)):
        pass
    assert Recorder.started == [["a::kernel"]]
