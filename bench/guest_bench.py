"""The host side of a bench that runs in the kernel guest (``kernel_guest.py``,
``kernel_footprint.py``): boot it once, run the script there with ``--inside``, read back
the record it wrote to its share; and a guest lab's retry when etcd misses its start.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import trio
from common import JSON, ROOT, LoadSampler

from vnetd.lab.etcd import EtcdStartError
from vnetd.lab.guest import guest_unavailable, run_in_guest
from vnetd.lab.guest_image import GuestUnavailable

LAB_TRIES = 3
"""Labs started in all when the guest's etcd misses its start bound (``with_lab_retries``)."""

T = TypeVar("T")


@dataclass(frozen=True)
class GuestRecord:
    """What one guest run gave: the script's record, the guest's figures, the host's
    load meanwhile, and the script's exit code."""

    inner: JSON
    guest: JSON
    load: JSON
    returncode: int


async def run_script_in_guest(
    script: Path,
    options: Sequence[str],
    output: str,
    *,
    run_timeout: float,
    boot_timeout: float,
) -> GuestRecord | int:
    """Boot the guest, run ``script --inside OPTIONS`` in it and read back ``output``
    (its JSON record, with ``runs``, ``failures`` and ``guest``); the guest's output
    goes to stdout. An exit code instead when there is no record: 0 where no guest can
    boot here (one line says why), 1 when the run failed."""
    name = script.name
    reason = guest_unavailable()
    if reason is not None:
        print(f"{name}: skipped, no kernel guest here: {reason}")
        return 0
    argv = [sys.executable, str(script), "--inside", *options]
    sampler = LoadSampler()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler.run)
        try:
            result = await trio.to_thread.run_sync(
                lambda: run_in_guest(
                    argv,
                    run_timeout=run_timeout,
                    cwd=ROOT,
                    outputs=[output],
                    boot_timeout=boot_timeout,
                )  # fmt: skip
            )
        except GuestUnavailable as error:
            print(f"{name}: the guest run failed: {error}")
            return 1
        finally:
            nursery.cancel_scope.cancel()
    sys.stdout.write(result.output)
    if output not in result.files:
        print(f"{name}: the guest wrote no {output} (exit {result.returncode})")
        return 1
    inner: JSON = json.loads(result.files[output])
    guest = {**inner["guest"], "boot_s": round(result.boot_seconds, 1),
             "wall_s": round(result.wall_seconds, 1),
             "accel": os.environ.get("VNETD_GUEST_ACCEL", "tcg")}  # fmt: skip
    return GuestRecord(inner, guest, sampler.summary(), result.returncode)


async def with_lab_retries(part: Callable[[], Awaitable[T]]) -> T:
    """``await part()``, again (``LAB_TRIES`` in all) when its lab's etcd did not start:
    under TCG on busy host cores etcd can miss the lab's 20 s readiness bound."""
    for n in range(1, LAB_TRIES):
        try:
            return await part()
        except EtcdStartError as error:
            print(f"  the lab's etcd did not start (try {n}/{LAB_TRIES}): {error}"[:300],
                  flush=True)  # fmt: skip
    return await part()
