"""Whether the registry takes writes now: one lease grant, revoked at once.

``vnetd doctor`` and ``vnetd status`` ask it when ranks of the spec are missing, to
say whether they could claim at all: while etcd's NOSPACE alarm is on it refuses every
lease grant (as it refuses puts and txns with a put), and a claim starts with one.
A grant is the cheapest write that asks nothing of the caller's key permissions (etcd
3.5.33 wants only an authenticated user), and its lease, if the revoke is lost, ends
with its TTL. The daemons report their own refusals in ``/status`` (``RegistryHealth``).
"""

from __future__ import annotations

import trio

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.registry.base import Registry

PROBE_TIMEOUT = 5.0
"""The grant and the revoke together, seconds (invariant 8); no answer is no evidence."""


async def writes_refused(registry: Registry, ttl: int) -> str | None:
    """etcd's refusal when it refuses writes for space (NOSPACE), else None: writes pass,
    or the probe was refused for another reason or got no answer (no evidence either way).

    Args:
        ttl: the lease's TTL, seconds (the mesh's: the client's bounds follow it).

    Cancellation: safe; a lease granted and not revoked ends with its TTL.
    """
    with trio.move_on_after(PROBE_TIMEOUT):
        try:
            lease = await registry.grant(ttl)
        except RegistryUnavailable as exc:
            return str(exc) if exc.kind == "full" else None
        except RegistryError:
            return None
        try:
            await registry.revoke(lease)
        except RegistryError:
            pass  # it ends with its TTL
    return None
