"""The e2e suite runs in the netns lab: root, ``ip``, etcd and wireguard-go are needed.

Without them every e2e test is skipped with the reason (shown by ``-rs``, in
the report header and in the run's last line), never failed; under ``CI`` they
run and fail instead. Bounds in these tests follow ``tests/README.md``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vnetd.lab.open_lab import Lab, open_lab

REQUIRED_TOOLS = ("ip", "unshare", "etcd", "etcdctl", "wireguard-go", "wg", "ping", "nft")


def e2e_skip_reason() -> str | None:
    """Why the e2e suite cannot run here, or None when it can."""
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    reasons = []
    if os.geteuid() != 0:
        reasons.append("needs root (network namespaces)")
    if missing:
        reasons.append(f"missing tools: {', '.join(missing)} (run scripts/setup)")
    if not os.path.exists("/dev/net/tun"):
        reasons.append("no /dev/net/tun (wireguard-go)")
    return "; ".join(reasons) or None


def pytest_report_header() -> str:
    reason = e2e_skip_reason()
    return f"e2e: SKIPPED, {reason}" if reason else "e2e: root, ip, etcd, wireguard-go present"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = e2e_skip_reason()
    if reason and os.environ.get("CI"):
        # In CI a missing prerequisite is a broken setup: let the tests fail on it.
        reason = None
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"e2e: {reason}"))


@pytest.fixture
async def lab() -> AsyncIterator[Lab]:
    """A 3-pod lab with etcd running; torn down after the test."""
    async with open_lab(3) as built:
        yield built
