"""Periodic requests spaced by the mesh's size, so a whole mesh costs etcd a bounded rate.

Each daemon asks etcd some things of its own accord while nothing changes: its
watch's quiet check (``registry.etcd.watch``), the re-read of the stored spec
(``control.spec_check``) and the restart of its member watch
(``control.watcher``). At a fixed period each costs etcd N requests per period
for a mesh of N, for ever: at 1024 members a 60 s watch restart alone is 17
requests a second, the spec read every two lease TTLs of 10 s is 51, a 3 s
quiet check 341. So each period is the longer of its own floor and N divided
by a rate for the whole mesh (``spaced``): a small mesh keeps its period, and a
large one costs etcd about that rate, whatever N (docs/architecture.md,
"Watch" and "Spec check"). A period so spaced is jittered down by up to a
quarter, never below its floor (``period``), so that daemons started in one
storm, or woken by one event, do not all ask in one burst; the jitter raises
the rate by up to a third (a seventh on average). N is what the daemon sees of
the mesh (the keys under the members prefix, or its view's members), so the
spacing follows the mesh as it grows. The reconciler's safety-net pass is spaced
the same way for a local cost, its CPU, which grows with the mesh
(``daemon.reconciler.FULL_PASS_PEERS``).
"""

from __future__ import annotations

import random

JITTER = 0.25
"""A spaced wait is cut by up to this share, at random."""


def spaced(floor: float, members: int, mesh_rate: float) -> float:
    """``floor`` s, or longer so that ``members`` daemons each waiting this long cost
    ``mesh_rate`` requests a second at most."""
    return max(floor, members / mesh_rate)


def period(floor: float, members: int, mesh_rate: float, rng: random.Random | None = None) -> float:
    """The next wait: ``spaced``, jittered down (never below ``floor``) when it is
    longer than ``floor``."""
    wait = spaced(floor, members, mesh_rate)
    if wait <= floor:
        return floor
    return max(floor, wait * (1.0 - JITTER * (rng or random).random()))
