"""Which process owns which lab, and the cleanup of labs whose owner is dead.

A marker file ``/run/vnetd-lab/<id>.json`` names the process that owns lab
``<id>`` (pid and start time) and its temp workdir; ``cleanup_stale_labs``
removes labs whose owner is dead, never a live one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from vnetd.lab.netns import delete_netns, kill_pids, list_netns, pids_in_netns, proc_start_time
from vnetd.lab.pods import LabError

LAB_RUN_DIR = Path("/run/vnetd-lab")
NETNS_PREFIX = "vlab-"
_NETNS_RE = re.compile(r"^vlab-([0-9a-f]{4})-")
_WORKDIR_PREFIX = "vnetd-lab-"
TEARDOWN_TIMEOUT = 40.0


def claim_lab(workdir: Path | None) -> tuple[str, Path]:
    """A fresh lab id, marked as this process's, and its workdir (made, or a temp dir).

    The marker records the workdir only when it is a temp dir, which
    ``cleanup_stale_labs`` may then remove.
    """
    lab_id = _claim_lab_id()
    try:
        if workdir is None:
            made = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{lab_id}-"))
            _write_marker(lab_id, made)
            return lab_id, made
        workdir.mkdir(parents=True, exist_ok=True)
        _write_marker(lab_id, None)
        return lab_id, workdir
    except BaseException:
        remove_marker(lab_id)
        raise


async def destroy_netns(names: Sequence[str]) -> None:
    """Kill (by pid) whatever still runs in the namespaces, then delete them."""
    leftover = [pid for pids in pids_in_netns(names).values() for pid in pids]
    if leftover:
        await kill_pids(leftover)
    await delete_netns(names)


async def cleanup_stale_labs() -> list[str]:
    """Remove the namespaces, processes and temp dirs of labs whose owner is dead.

    A lab is live while the pid in its marker runs with the same start time;
    namespaces named like a lab but without a marker are orphans. Returns the
    ids of the labs removed.
    """
    markers = _read_markers()
    live = {lab_id for lab_id, m in markers.items() if _owner_alive(m)}
    stale_ns: dict[str, list[str]] = {}
    for name in await list_netns():
        match = _NETNS_RE.match(name)
        if match and match.group(1) not in live:
            stale_ns.setdefault(match.group(1), []).append(name)
    stale_ids = sorted(set(stale_ns) | (set(markers) - live))
    if not stale_ids:
        return []
    with trio.move_on_after(TEARDOWN_TIMEOUT, shield=True):
        await destroy_netns([n for names in stale_ns.values() for n in names])
        for lab_id in stale_ids:
            workdir = markers.get(lab_id, {}).get("workdir")
            if isinstance(workdir, str) and Path(workdir).name.startswith(_WORKDIR_PREFIX):
                shutil.rmtree(workdir, ignore_errors=True)
            remove_marker(lab_id)
    return stale_ids


def remove_marker(lab_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (LAB_RUN_DIR / f"{lab_id}.json").unlink()


def _claim_lab_id() -> str:
    """A fresh 4-hex id whose marker names this process; the marker appears whole."""
    LAB_RUN_DIR.mkdir(parents=True, exist_ok=True)
    tmp = LAB_RUN_DIR / f"claim.tmp{os.getpid()}"
    tmp.write_text(json.dumps(_owner_record(None)))
    try:
        for _ in range(100):
            lab_id = secrets.token_hex(2)
            try:
                os.link(tmp, LAB_RUN_DIR / f"{lab_id}.json")
            except FileExistsError:
                continue
            return lab_id
    finally:
        tmp.unlink()
    raise LabError(f"no free lab id in {LAB_RUN_DIR} (clean it up)")


def _owner_record(workdir: Path | None) -> dict[str, Any]:
    pid = os.getpid()
    return {"pid": pid, "start": proc_start_time(pid),
            "workdir": str(workdir) if workdir else None}  # fmt: skip


def _write_marker(lab_id: str, workdir: Path | None) -> None:
    path = LAB_RUN_DIR / f"{lab_id}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(_owner_record(workdir)))
    os.replace(tmp, path)


def _read_markers() -> dict[str, dict[str, Any]]:
    LAB_RUN_DIR.mkdir(parents=True, exist_ok=True)
    return {path.stem: _read_marker(path) for path in LAB_RUN_DIR.glob("*.json")}


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _owner_alive(marker: Mapping[str, Any]) -> bool:
    pid, start = marker.get("pid"), marker.get("start")
    return isinstance(pid, int) and start is not None and proc_start_time(pid) == start
