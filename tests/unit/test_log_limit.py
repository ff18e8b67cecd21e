"""``LogLimit``: at most ``NAMED`` warnings of a kind a window, the rest summarised."""

from __future__ import annotations

import logging

import pytest

from vnetd.control.log_limit import NAMED, WINDOW, LogLimit


def test_a_flood_is_named_up_to_the_limit_then_summarised(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limit = LogLimit(
        logging.getLogger("t"), "refused registry writes", "refused writes", lambda: now[0]
    )
    built: list[int] = []

    def line(n: int) -> str:
        built.append(n)
        return f"refused {n}"

    with caplog.at_level(logging.WARNING, "t"):
        for n in range(1, 51):
            limit.warn(lambda n=n: line(n), n)
        now[0] += WINDOW
        limit.warn(lambda: line(51), 51)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:NAMED] == [f"refused {n}" for n in range(1, NAMED + 1)]
    assert "more than 20 refused registry writes in 60 s" in messages[NAMED]
    assert messages[NAMED + 1] == (
        "skipped 30 more refused registry writes without naming them (50 refused writes seen in all)"
    )
    assert messages[NAMED + 2] == "refused 51"
    assert built == [*range(1, NAMED + 1), 51]  # a line not logged is never built
