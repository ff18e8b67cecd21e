"""One bounded read of a mesh's registered members, for ``vnetd render wg-quick``."""

from __future__ import annotations

import trio

from vnetd.control.membership import read_members
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.registry import RegistryOpener, open_registry
from vnetd.spec import MeshSpec

__all__ = ["READ_TIMEOUT", "RegistryOpener", "read_members_now"]

READ_TIMEOUT = 10.0


def read_members_now(
    spec: MeshSpec,
    opener: RegistryOpener | None = None,
    timeout: float = READ_TIMEOUT,
) -> tuple[dict[int, Member], int]:
    """The members registered now and the number of bad entries skipped.

    Runs its own ``trio.run``: call it from synchronous code only.

    Args:
        opener: opens the registry of ``spec.registry``; ``open_registry``
            (etcd with the spec's TLS and auth settings) when None.
        timeout: the bound of the whole read, seconds.

    Raises:
        RegistryUnavailable: no answer within ``timeout``, or no endpoint
            reachable; the message names the endpoints and the fix.
    """
    return trio.run(_read, spec, opener or open_registry, timeout)


async def _read(
    spec: MeshSpec, opener: RegistryOpener, seconds: float
) -> tuple[dict[int, Member], int]:
    endpoints = ", ".join(spec.registry.endpoints)
    fix = f"check that etcd runs at {endpoints}, or pass --etcd URL"
    try:
        with trio.fail_after(seconds):
            async with opener(spec.registry) as registry:
                return await read_members(registry, spec)
    except trio.TooSlowError:
        raise RegistryUnavailable(
            f"reading the members of mesh {spec.name}: no answer within {seconds:g} s; {fix}"
        ) from None
    except RegistryUnavailable as exc:
        raise RegistryUnavailable(
            f"reading the members of mesh {spec.name}: {exc}; {fix}"
        ) from None
