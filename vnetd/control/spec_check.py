"""A running daemon's check of the stored spec: put back when lost, reported when changed.

The daemon compares the spec at start (``membership.ensure_spec``) and runs on that
one for its life; a writer of the mesh's prefix may overwrite the stored spec
later, after which every new start exits 2. ``SpecCheck.run`` reads it again every
``SPEC_CHECK_TTLS`` lease TTLs (a large mesh: less often, ``vnetd.pacing``), in a
task of its own beside the claim's keepalive (never in its loop: a read waiting
on a slow member must not delay a renewal), so the running daemons
say so (a log line when it changes, ``vnetd_spec_differs``, ``/status``) before a
restart finds out (docs/security.md, "Threat model").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from vnetd.control.membership import ensure_spec, spec_key
from vnetd.errors import RegistryError, SpecMismatch
from vnetd.pacing import period
from vnetd.registry.base import Registry
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.claim")

SPEC_CHECK_TTLS = 2
"""Lease TTLs between reads of the stored spec: one small read per six keepalives, for
a mesh small enough (``vnetd.pacing``: a large one spaces them by its size)."""
SPEC_READS = 4.0
"""Reads of the stored spec per second a whole mesh may cost etcd."""


class SpecCheck:
    """``differs``: the mismatch message while the stored spec differs from ours, else None.

    ``members``: how many daemons the mesh has now (each checks), which spaces the
    checks (``vnetd.pacing``); None: one.
    """

    def __init__(
        self, registry: Registry, spec: MeshSpec, members: Callable[[], int] | None = None
    ) -> None:
        self.registry, self.spec, self.key = registry, spec, spec_key(spec)
        self.differs: str | None = None
        self.interval = SPEC_CHECK_TTLS * spec.registry.lease_ttl
        self._members = members or (lambda: 1)

    def next_wait(self) -> float:
        """``interval`` s, or longer for a large mesh (``vnetd.pacing.period``)."""
        return period(self.interval, self._members(), SPEC_READS)

    async def run(self) -> None:
        """``check`` every ``next_wait()`` s, the first one wait after the start."""
        while True:
            await trio.sleep(self.next_wait())
            await self.check()

    async def check(self) -> None:
        """Read the stored spec; store it if absent (a reset store), report a change.

        Never raises for the registry: a failed read is tried at the next check.
        """
        try:
            stored = await ensure_spec(self.registry, self.spec)
        except SpecMismatch as exc:
            if str(exc) != self.differs:
                log.error(
                    "%s; this daemon keeps running with the spec it checked at start, and "
                    "a daemon started now exits until one of them is changed back",
                    exc,
                )
            self.differs = str(exc)
            return
        except RegistryError as exc:  # unavailable, or a credential that may only read it
            log.debug("spec check at %s: %s", self.key, exc)
            return
        if stored:
            log.warning("the registry had lost the spec; stored it again at %s", self.key)
        elif self.differs is not None:
            log.warning("the spec stored at %s matches ours again", self.key)
        self.differs = None
