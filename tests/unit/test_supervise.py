"""The pure parts of wireguard-go supervision: the restart budget, the last output line."""

from __future__ import annotations

import pytest

from vnetd.dataplane.wireguard_go import supervise
from vnetd.dataplane.wireguard_go.supervise import RestartBudget, WireguardGo


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        pytest.param([0.0], [0.0], id="first-at-once"),
        pytest.param([0, 1, 2, 3, 4], [0.0, 0.5, 1.0, 2.0, 4.0], id="backs-off"),
        pytest.param([0, 1, 2, 3, 4, 5], [0.0, 0.5, 1.0, 2.0, 4.0, None], id="gives-up"),
        pytest.param([0, 10, 20, 30, 40, 61], [0.0, 0.5, 1.0, 2.0, 4.0, 4.0], id="window-slides"),
        pytest.param([0, 100, 200], [0.0, 0.0, 0.0], id="rare-deaths-restart-at-once"),
    ],
)
def test_restart_budget(times: list[float], expected: list[float | None]) -> None:
    budget = RestartBudget(limit=5, window=60.0, first_delay=0.5, max_delay=4.0)
    assert [budget.next_delay(t) for t in times] == expected


def test_a_spent_budget_stays_spent_within_the_window() -> None:
    budget = RestartBudget(limit=2, window=60.0)
    assert [budget.next_delay(t) for t in (0, 1, 2, 3)] == [0.0, 0.5, None, None]
    assert budget.next_delay(60.5) == 0.5  # the first restart left the window


@pytest.mark.parametrize(
    ("output", "line"),
    [
        pytest.param(b"", "", id="empty"),
        pytest.param("┌──────┐\n│ use the kernel │\n└──────┘\n".encode(), "", id="only-the-banner"),
        pytest.param(
            "┌──┐\n└──┘\nERROR: (vnet0) 2024/01/01 Failed to create TUN device: busy\n\n".encode(),
            "ERROR: (vnet0) 2024/01/01 Failed to create TUN device: busy",
            id="last-non-empty-line",
        ),
        pytest.param(b"x" * 20000 + b"\nlast\n", "last", id="long-output-read-from-the-tail"),
    ],
)
def test_last_line(tmp_path, monkeypatch: pytest.MonkeyPatch, output: bytes, line: str) -> None:
    monkeypatch.setattr(supervise, "SOCKET_DIR", str(tmp_path))
    (tmp_path / "vnet0.log").write_bytes(output)
    process = WireguardGo("vnet0", 1, process=None, pidfd=None)
    assert process.last_line() == line


def test_last_line_without_an_output_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise, "SOCKET_DIR", str(tmp_path))
    assert WireguardGo("vnet0", 1, process=None, pidfd=None).last_line() == ""
