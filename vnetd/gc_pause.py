"""The cyclic garbage collector paused while ``vnetd up`` starts.

Importing the daemon's libraries allocates hundreds of thousands of objects, and
each 700 of them start a collection that finds nearly nothing: about 100 young
and 9 middle collections before the claim, some 10 ms of CPU on a launcher's
path (docs/architecture.md, "Start-up"). The command pauses the collector from its
entry; the daemon resumes it once it has claimed its rank (or after
``MAX_PAUSE`` s without a claim), with one full collection and then
``gc.freeze``: what the start made lives as long as the process, and no later
collection walks it again. Only a pause made here is resumed, so a process that
turned the collector off itself keeps it off.
"""

from __future__ import annotations

import gc

MAX_PAUSE = 10.0
"""Seconds the daemon keeps the collector paused while its claim waits (etcd down)."""

_paused = False


def pause() -> None:
    """Turn the collector off until ``resume``, unless it is off already."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(*, freeze: bool = True) -> None:
    """Turn the collector on again if ``pause`` turned it off; with ``freeze``, first
    collect and freeze what is left (the daemon, once claimed; a command that is not
    ``up`` only turns it on)."""
    global _paused
    if _paused:
        _paused = False
        if freeze:
            gc.collect()
            gc.freeze()
        gc.enable()
