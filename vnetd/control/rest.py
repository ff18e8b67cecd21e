"""What a mesh at rest costs etcd beyond its keepalives: periodic requests spaced by its size.

Each daemon makes two requests of its own accord while nothing changes: it
reads the stored spec again (``control.spec_check``) and restarts its member
watch from the last revision (``control.watcher``). At a fixed period each
costs etcd N requests per period for a mesh of N, for ever: at 1024 members a
60 s watch restart alone is 17 requests a second, and the spec read every two
lease TTLs of 10 s is 51. So each period is the longer of its own floor and
N divided by a mesh-wide rate: a small mesh keeps its periods, and a large one
costs etcd about that rate for each, whatever N (docs/architecture.md,
"Watch" and "Spec check"). A period so spaced is jittered down by up to a
quarter (never below its floor), so that daemons started in one storm do not
all ask in one burst every period; the jitter raises the rate by up to a
seventh (1 / 0.875 on average).
N is the daemon's view of the members (every member watches and checks), so
the spacing follows the mesh as it grows.
"""

from __future__ import annotations

import random

SPEC_READS = 4.0
"""Reads of the stored spec per second a whole mesh may cost etcd."""
WATCH_RESTARTS = 4.0
"""Watch restarts per second a whole mesh may cost etcd."""
JITTER = 0.25
"""A spaced wait is cut by up to this share, at random."""


def period(floor: float, members: int, mesh_rate: float, rng: random.Random | None = None) -> float:
    """The next wait: ``floor`` s, or for a mesh whose ``members`` would then cost
    more than ``mesh_rate`` requests a second, ``members / mesh_rate`` s jittered."""
    spaced = members / mesh_rate
    if spaced <= floor:
        return floor
    return max(floor, spaced * (1.0 - JITTER * (rng or random).random()))
