"""Fixtures and reporting for every suite."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Generator, Iterator

import pytest


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
