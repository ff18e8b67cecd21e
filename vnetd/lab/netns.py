"""Thin, bounded wrappers around ``ip netns`` / ``ip link`` and pid handling.

Every call has a timeout. Nothing here creates anything in the root network
namespace: callers pass the namespace each command runs in.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

IP_BIN = "ip"
NETNS_RUN_DIR = "/run/netns"
IP_TIMEOUT = 10.0
"""Bound on one ``ip`` invocation (they take milliseconds)."""


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


async def ip(
    *args: str,
    netns: str | None = None,
    stdin: str | None = None,
    check: bool = True,
    time_limit: float = IP_TIMEOUT,
) -> str:
    """Run ``ip [-n NETNS] ARGS...`` and return its stdout.

    Raises:
        NetnsError: it exited non-zero (when ``check``) or took over ``time_limit`` s.
    """
    argv = [IP_BIN, *(("-n", netns) if netns else ()), *args]
    with trio.move_on_after(time_limit):
        result = await trio.run_process(
            argv,
            stdin=stdin.encode() if stdin is not None else b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if check and result.returncode != 0:
            err = result.stderr.decode(errors="replace").strip()
            raise NetnsError(f"{' '.join(argv)} exited {result.returncode}: {err}")
        return result.stdout.decode(errors="replace")
    raise NetnsError(f"{' '.join(argv)} took over {time_limit} s")


async def ip_batch(
    commands: Iterable[str], *, netns: str | None = None, force: bool = False
) -> None:
    """Run several ``ip`` commands (without the leading ``ip``) in one process.

    Args:
        commands: e.g. ``["link set lo up", "addr add 198.18.1.0/15 dev eth0"]``.
        netns: run them inside this network namespace.
        force: go on after a failing command (the exit status still reports it).
    """
    lines = "".join(f"{c}\n" for c in commands)
    await ip(*(("-force",) if force else ()), "-batch", "-", netns=netns, stdin=lines,
             check=not force)  # fmt: skip


async def add_netns(names: Iterable[str]) -> None:
    """Create the named network namespaces (fails if one exists)."""
    await ip_batch(f"netns add {name}" for name in names)


async def delete_netns(names: Iterable[str]) -> None:
    """Delete the named network namespaces; absent ones are fine."""
    await ip_batch((f"netns delete {name}" for name in names), force=True)


async def list_netns() -> list[str]:
    """Names of all named network namespaces."""
    out = await ip("netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in_netns(names: Iterable[str]) -> dict[str, list[int]]:
    """Pids of the live processes in each named network namespace (one /proc scan)."""
    wanted: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = os.stat(f"{NETNS_RUN_DIR}/{name}")
        except OSError:
            continue
        wanted[(st.st_dev, st.st_ino)] = name
    found: dict[str, list[int]] = {name: [] for name in wanted.values()}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        owner = wanted.get((st.st_dev, st.st_ino))
        if owner is not None and pid_alive(int(entry)):
            found[owner].append(int(entry))
    return found


def proc_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def child_pid(parent: int, comm: str) -> int | None:
    """The pid of ``parent``'s child process named ``comm`` (from /proc), if any."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and name == comm:
            return int(entry)
    return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return proc_start_time(pid) is not None


def signal_pid(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; a vanished process is fine."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def kill_pids(pids: Sequence[int], *, grace: float = 3.0) -> list[int]:
    """SIGTERM each pid, wait up to ``grace`` s, then SIGKILL the rest.

    For processes that are not our children (we cannot reap them); polls
    ``/proc``. Returns the pids still alive afterwards (normally none).
    """
    for pid in pids:
        signal_pid(pid, signal.SIGTERM)
    alive = await _wait_gone(pids, grace)
    for pid in alive:
        signal_pid(pid, signal.SIGKILL)
    return await _wait_gone(alive, grace)


async def _wait_gone(pids: Sequence[int], limit: float) -> list[int]:
    alive = [p for p in pids if pid_alive(p)]
    with trio.move_on_after(limit):
        for _ in range(int(limit / 0.02) + 1):
            alive = [p for p in alive if pid_alive(p)]
            if not alive:
                break
            await trio.sleep(0.02)
    return [p for p in alive if pid_alive(p)]
