"""Fixtures and reporting for every suite."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from kernel_guest import (
    configure_worker,
    delegate_kernel_items,
    guest_in_background,
    guest_summary,
    in_guest,
    note_test_start,
    order_guest_cases_last,
    record_guest_report,
    start_for_workers,
    write_guest_results,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kernel: needs kernel WireGuard; runs in the QEMU kernel guest where the host "
        "lacks it (tests/kernel_guest.py)",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """After every suite's own marks: the kernel tests go to the guest if needed, and
    run last (the guest runs them beside the host tests, ``pytest_runtestloop``)."""
    delegate_kernel_items(items)
    order_guest_cases_last(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    """The kernel guest boots as the tests start and runs beside them; it is ended
    (QEMU killed by its pid) when the loop ends, however it ends."""
    with guest_in_background(session):
        return (yield)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record_guest_report(report)


# Under pytest-xdist (scripts/test -n 2) the controller runs the kernel guest for its workers.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    configure_worker(node.config, node.workerinput)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any) -> None:
    start_for_workers(node.config)


def pytest_runtest_logstart(nodeid: str) -> None:
    note_test_start(nodeid)


def pytest_sessionfinish() -> None:
    write_guest_results()


def pytest_report_header() -> str | None:
    # Only what is known without a probe: the probe (a netns and a wireguard link)
    # runs only when kernel tests are collected, and the guest summary reports it.
    return "kernel: inside the kernel guest" if in_guest() else None


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """Tests that call ``vnetd.cli.main`` point the root logger at that test's
    captured stderr; put pytest's handlers back so later tests do not log
    into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None]:
    """End a run that skipped tests with one line: how many, and why.

    A run without root, etcd or wireguard-go skips the tests of the real parts
    (the e2e suite, the wireguard-go and kernel contract cases) and is green
    otherwise; this line says what it did not check. Under ``CI`` those
    prerequisites are required instead (``tests/e2e/conftest.py``,
    ``tests/contract/conftest.py``).
    """
    try:
        return (yield)
    finally:
        guest = guest_summary(terminalreporter.config)
        if guest:
            terminalreporter.write_line(guest)
        reasons = Counter(skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
        if reasons:
            why = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
            terminalreporter.write_line(
                f"SKIPPED {sum(reasons.values())} tests, which did not run: {why}", yellow=True
            )


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skip report gives, without pytest's ``Skipped:`` prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")
