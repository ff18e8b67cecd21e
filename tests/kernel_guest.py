"""Tests marked ``kernel`` run against kernel WireGuard: on the host if its kernel has
it, else all together in one QEMU guest (``vnetd.lab.guest``) that does.

On a host without the module, collection replaces every ``kernel`` test with a
``GuestCase`` of the same node id and moves them after the host tests. As the
test loop starts, a thread of the session boots the guest once and runs every
selected kernel test inside, in one pytest process (``VNETD_GUEST=1``) that
writes each test's outcome to the guest's results share
(``record_guest_report``), while the host tests run beside it (QEMU at a lower
priority, ``GUEST_NICE``, until the host waits for it). Each ``GuestCase`` waits
for that run and reports the guest's outcome for its own id: passed, failed with
the guest's report, or skipped with the guest's reason. The loop's end (the last test, ``-x``, a
failure, Ctrl-C) stops a guest still running: QEMU is killed by its pid.

Under pytest-xdist (``scripts/test -n 2 --dist load``) the controller runs the
guest, once: every worker collects the same items, and the first to report its
collection has written the ``GuestCase`` ids to a run directory the controller
handed out (``pytest_configure_node``); the controller boots the guest then,
notes when a worker starts a ``GuestCase`` (the host's wait, in the summary),
writes the run's outcome to that directory, and stops the guest when its own
loop ends. A ``GuestCase`` on a worker waits for that file; a worker boots no
guest of its own.

No guest here (no QEMU, no kernel unpacked, not root): the cases skip with one
line naming the fix, except under ``CI``, where they fail with it. A guest that
does not boot, or a run that times out, fails them everywhere. Inside the guest
a kernel without WireGuard fails the cases (``tests/contract/test_dataplane.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from vnetd.lab.guest import (
    BOOT_TIMEOUT,
    POWEROFF_TIMEOUT,
    GuestControl,
    guest_unavailable,
    run_in_guest,
)
from vnetd.lab.guest_image import GuestUnavailable

KERNEL_MARK = "kernel"
RESULTS_FILE = "results.json"
GUEST_RUN_TIMEOUT = 1500.0
"""Bound on the guest's whole pytest run: about 3-4 minutes under TCG on a quiet
machine before the dual-stack and thousand-peer tests, which add about 2.5 and 2-4
more (8-9 in all on a quiet machine); at a load of 20-60 on 2 cores the whole set
missed 900 s (each test inside keeps its own timeout)."""
GUEST_TEST_TIMEOUT = 600.0
"""pytest-timeout for each test inside the guest, above each one's own hang guard
(580 s): on a host half as fast as usual (the guest booted in 20-23 s instead of
9), the three-pod kernel walk took 185 s alone and over 280 s beside the host tests."""
GUEST_NICE = 5
"""QEMU's niceness while host tests run beside it: they keep most of their timing
(their bounds are tight, the guest's waits are hang guards) and the guest takes the
CPU they leave and about a quarter of a core they contend for (a nice-5 thread
weighs a third of a nice-0 one). Once the host waits for the guest, it runs at 0.
Under xdist the guest runs at 0 throughout: two workers fill both cores, and at 5 the
guest's boot missed its bound beside them."""
WAIT_STEP = 1.0
STOP_WAIT = 30.0
"""Bound on ending a guest still running at the session's end (the kill, the reap)."""
IN_GUEST = "VNETD_GUEST"
NOT_COPIED = {"trio", "parametrize", "usefixtures"}
"""Marks of a test that concern running its function, which a ``GuestCase`` does not."""
RUN_DIR_INPUT = "vnetd_guest_run_dir"
"""Key of the run directory in an xdist worker's ``workerinput``."""
IDS_FILE = "ids.json"
RUN_FILE = "run.json"

_reports: dict[str, dict[str, Any]] = {}
_host_probe: list[str | None] = []
_controller_guest: list[BackgroundGuest] = []
"""The guest an xdist controller runs (its hooks that see workers' tests get no config)."""


def in_guest() -> bool:
    return os.environ.get(IN_GUEST) == "1"


def host_kernel_unavailable() -> str | None:
    """Why this host cannot create a wireguard link (probed once, in a fresh netns), or None."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and ip"
    if not _host_probe:
        from vnetd.dataplane.kernel.device import kernel_unavailable

        name = f"vnkg-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
        try:
            _host_probe.append(trio.run(kernel_unavailable, name))
        finally:
            subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)
    return _host_probe[0]


def xdist_controller(config: pytest.Config) -> bool:
    """This process hands the tests to xdist workers and runs none itself."""
    return config.pluginmanager.has_plugin("dsession")


def xdist_run_dir(config: pytest.Config) -> Path | None:
    """On an xdist worker, the run directory its controller shares with it."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else Path(workerinput[RUN_DIR_INPUT])


def delegate_kernel_items(items: list[pytest.Item]) -> None:
    """Swap the ``kernel`` tests for ``GuestCase`` items when this host lacks the module;
    on an xdist worker, tell the controller their ids."""
    if in_guest() or not any(item.get_closest_marker(KERNEL_MARK) for item in items):
        return
    if host_kernel_unavailable() is None:
        return
    _swap_kernel_items(items)
    run_dir = xdist_run_dir(items[0].config)
    if run_dir is not None:
        ids = [item.nodeid for item in items if isinstance(item, GuestCase)]
        _write_atomically(run_dir / IDS_FILE, json.dumps(ids))


def _swap_kernel_items(items: list[pytest.Item]) -> None:
    for index, item in enumerate(items):
        if item.get_closest_marker(KERNEL_MARK) is None or item.parent is None:
            continue
        case = GuestCase.from_parent(item.parent, name=item.name)
        for mark in item.own_markers:
            if mark.name not in NOT_COPIED:
                case.own_markers.append(mark)
                case.keywords[mark.name] = mark
        # Above the guest run's own bounds (boot, run, power-off, the kill), so the run
        # ends by its own timeout first and names the reason.
        bound = BOOT_TIMEOUT + GUEST_RUN_TIMEOUT + POWEROFF_TIMEOUT + 120
        case.add_marker(pytest.mark.timeout(bound), append=False)
        items[index] = case


@dataclass
class GuestRun:
    """The one guest run of a session: each node id's outcome, or why it did not run."""

    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    missing: str | None = None
    output: str = ""
    summary: str = ""


class BackgroundGuest:
    """The session's guest run in a thread of its own, started before the first test.

    ``waiting`` puts the guest at full priority (a test now waits for it);
    ``result`` waits for the outcome; ``stop`` ends the run (QEMU killed by its pid,
    its temp dir removed) and waits for the thread, at most ``STOP_WAIT``. With
    ``publish``, the outcome is also written there, for xdist workers.
    """

    def __init__(
        self, ids: list[str], rootpath: Path, publish: Path | None = None, nice: int = GUEST_NICE
    ) -> None:
        self.ids = ids
        self.rootpath = rootpath
        self.publish = publish
        self.started = time.monotonic()
        self.waiting_since: float | None = None
        self.finished: float | None = None
        self._control = GuestControl(nice=nice)
        self._run: GuestRun | None = None
        self._thread = threading.Thread(target=self._main, name="kernel-guest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            run = run_guest(self.ids, self.rootpath, self._control)
        except BaseException as exc:  # a bug: reported by every case, not lost in a thread
            run = GuestRun(error=f"{type(exc).__name__}: {exc}")
        self._run = run
        self.finished = time.monotonic()
        if self.publish is not None:
            _write_atomically(self.publish, json.dumps(dataclasses.asdict(run)))

    def waiting(self) -> None:
        """A test waits for the guest now: from here on, it runs at full priority."""
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        if self._thread.is_alive():
            self._control.renice(0)

    @property
    def waited(self) -> float | None:
        """How long the first test that waited for the guest waited, once it has ended."""
        if self.waiting_since is None or self.finished is None:
            return None
        return max(0.0, self.finished - self.waiting_since)

    def result(self) -> GuestRun:
        """The run's outcome, once it has ended (each case's timeout bounds the wait)."""
        self.waiting()
        while self._thread.is_alive():
            self._thread.join(WAIT_STEP)  # in steps: a timeout's signal or Ctrl-C gets in
        assert self._run is not None
        return self._run

    def stop(self) -> None:
        self._control.stop.set()
        self._thread.join(STOP_WAIT)


_guest_key = pytest.StashKey[BackgroundGuest]()


def order_guest_cases_last(items: list[pytest.Item]) -> None:
    """Run the ``GuestCase`` items after every host test (in their own order): the
    guest runs them all meanwhile, so the host waits for it only at the end."""
    items.sort(key=lambda item: isinstance(item, GuestCase))  # a stable sort


@contextmanager
def guest_in_background(session: pytest.Session) -> Iterator[None]:
    """Around the session's test loop: start the guest run of its ``GuestCase``
    items, and end it however the loop ends (a failure, ``-x``, Ctrl-C). An xdist
    controller starts its guest once a worker has collected (``start_for_workers``)."""
    if xdist_controller(session.config):
        try:
            yield
        finally:
            for guest in _controller_guest:
                guest.stop()
            run_dir = session.config.stash.get(_run_dir_key, None)
            if run_dir is not None:
                shutil.rmtree(run_dir, ignore_errors=True)
        return
    if xdist_run_dir(session.config) is not None:
        yield  # a worker: its cases read the controller's run (``published_run``)
        return
    ids = [item.nodeid for item in session.items if isinstance(item, GuestCase)]
    options = session.config.option
    # pytest runs no test after a collection error unless told to go on.
    stopped = session.testsfailed and not options.continue_on_collection_errors
    if not ids or options.collectonly or stopped:
        yield
        return
    guest = BackgroundGuest(ids, session.config.rootpath)
    session.config.stash[_guest_key] = guest
    guest.start()
    try:
        yield
    finally:
        guest.stop()


_run_dir_key = pytest.StashKey[Path]()


def configure_worker(config: pytest.Config, workerinput: dict[str, Any]) -> None:
    """On the xdist controller, for each worker it starts: the shared run directory."""
    run_dir = config.stash.get(_run_dir_key, None)
    if run_dir is None:
        run_dir = config.stash[_run_dir_key] = Path(tempfile.mkdtemp(prefix="vnetd-guest-run-"))
    workerinput[RUN_DIR_INPUT] = str(run_dir)


def start_for_workers(config: pytest.Config) -> None:
    """On the xdist controller, once a worker has collected: start the guest run of
    the ``GuestCase`` ids it wrote, if it wrote any (once a session)."""
    run_dir = config.stash.get(_run_dir_key, None)
    if _controller_guest or run_dir is None or not (run_dir / IDS_FILE).exists():
        return
    ids = json.loads((run_dir / IDS_FILE).read_text())
    guest = BackgroundGuest(ids, config.rootpath, publish=run_dir / RUN_FILE, nice=0)
    config.stash[_guest_key] = guest
    _controller_guest.append(guest)
    guest.start()


def note_test_start(nodeid: str) -> None:
    """On the xdist controller, a worker starts ``nodeid``: if it waits for the guest,
    the host's wait starts (``BackgroundGuest.waited``)."""
    for guest in _controller_guest:
        if nodeid in guest.ids:
            guest.waiting()


def published_run(run_dir: Path) -> GuestRun:
    """On an xdist worker: the run's outcome, once the controller has written it (each
    case's timeout bounds the wait)."""
    path = run_dir / RUN_FILE
    while not path.exists():
        time.sleep(WAIT_STEP)
    return GuestRun(**json.loads(path.read_text()))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class GuestCase(pytest.Item):
    """A ``kernel`` test whose outcome comes from the guest run of this session."""

    def runtest(self) -> None:
        run_dir = xdist_run_dir(self.config)
        if run_dir is not None:
            run = published_run(run_dir)  # the xdist controller runs the guest
        else:
            run = self.config.stash[_guest_key].result()  # guest_in_background started it
        if run.missing is not None:
            message = f"kernel WireGuard: no kernel guest here: {run.missing}"
            if os.environ.get("CI"):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        if run.error is not None:
            pytest.fail(f"the kernel guest failed: {run.error}", pytrace=False)
        outcome = run.outcomes.get(self.nodeid)
        if outcome is None:
            pytest.fail(
                f"the kernel guest did not report {self.nodeid}; its output ends:\n"
                + "\n".join(run.output.splitlines()[-40:]),
                pytrace=False,
            )
        if outcome["outcome"] == "skipped":
            pytest.skip(f"in the kernel guest: {outcome['reason']}")
        if outcome["outcome"] != "passed":
            pytest.fail(f"in the kernel guest:\n{outcome['longrepr']}", pytrace=False)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.name} (in the kernel guest)"


def run_guest(ids: list[str], rootpath: Path, control: GuestControl) -> GuestRun:
    """Boot the guest once and run the tests ``ids`` inside it."""
    missing = guest_unavailable()
    if missing is not None:
        return GuestRun(missing=missing)
    argv = [
        sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
        f"--rootdir={rootpath}", f"--timeout={GUEST_TEST_TIMEOUT:.0f}", *ids,
    ]  # fmt: skip
    started = time.monotonic()
    try:
        result = run_in_guest(
            argv, run_timeout=GUEST_RUN_TIMEOUT, cwd=rootpath,
            env={"PYTHONDONTWRITEBYTECODE": "1"}, outputs=(RESULTS_FILE,),
            control=control,
        )  # fmt: skip
    except GuestUnavailable as error:
        return GuestRun(error=str(error))
    summary = (
        f"kernel guest: {len(ids)} tests in one QEMU guest beside the host tests, "
        f"boot {result.boot_seconds:.1f} s, {time.monotonic() - started:.1f} s in all, "
        f"its pytest exited {result.returncode}"
    )
    raw = result.files.get(RESULTS_FILE)
    if raw is None:
        error = "no results; its output ends:\n" + result.output[-4000:]
        return GuestRun(error=error, summary=summary)
    return GuestRun(outcomes=json.loads(raw), output=result.output, summary=summary)


def guest_summary(config: pytest.Config) -> str | None:
    """One line on the session's guest run (what it ran, what it cost), if there was one."""
    guest = config.stash.get(_guest_key, None)
    if guest is None:
        return None
    run = guest._run
    if run is None:
        return f"kernel guest: stopped unfinished after {time.monotonic() - guest.started:.1f} s"
    if not run.summary or guest.waited is None:
        return run.summary or None
    return f"{run.summary}; the host waited {guest.waited:.1f} s for it"


def record_guest_report(report: pytest.TestReport) -> None:
    """Inside the guest: fold a phase's report into its test's outcome."""
    if not in_guest():
        return
    entry = _reports.setdefault(report.nodeid, {"outcome": "passed", "longrepr": "", "reason": ""})
    if report.failed:
        entry["outcome"] = "failed"
        entry["longrepr"] += f"[{report.when}] {report.longreprtext}\n"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        longrepr = report.longrepr
        entry["reason"] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def write_guest_results() -> None:
    """Inside the guest: every test's outcome to the results share, for the host."""
    share = os.environ.get("VNETD_GUEST_SHARE")
    if in_guest() and share:
        (Path(share) / RESULTS_FILE).write_text(json.dumps(_reports))
