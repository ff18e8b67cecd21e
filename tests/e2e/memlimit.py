"""Put one process under a memory limit: a child of this test's own memory cgroup
(cgroup v2 ``memory.max``, or v1 ``memory.limit_in_bytes``), removed again on exit.

Only the given pid is moved, and it is moved back to this test's cgroup before the
child is removed, so nothing else of the machine is touched.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    v2: bool

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None


def own_memory_cgroup() -> tuple[Path, bool] | None:
    """This process's memory cgroup directory and whether it is cgroup v2."""
    v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if v2 and hierarchy == "0":
            return CGROUP_ROOT / path.lstrip("/"), True
        if not v2 and "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/"), False
    return None


def why_unavailable() -> str | None:
    found = own_memory_cgroup()
    if found is None:
        return "no memory cgroup for this process"
    if not os.access(found[0], os.W_OK):
        return f"memory cgroup {found[0]} is not writable"
    return None


@contextmanager
def memory_limit(pid: int, limit: int) -> Iterator[MemoryCgroup]:
    """``pid`` in a new child memory cgroup limited to ``limit`` bytes, until exit."""
    found = own_memory_cgroup()
    assert found is not None, why_unavailable()
    parent, v2 = found
    child = parent / f"vnetd-test-{uuid.uuid4().hex[:8]}"
    child.mkdir()
    try:
        (child / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        if v2:
            (child / "memory.swap.max").write_text("0")
        (child / "cgroup.procs").write_text(str(pid))
        yield MemoryCgroup(child, v2)
    finally:
        for line in (child / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(line)
            except OSError:
                pass  # it exited meanwhile
        child.rmdir()
