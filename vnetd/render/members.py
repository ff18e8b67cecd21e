"""One bounded read of a mesh's registered members, for ``vnetd render wg-quick``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import trio

from vnetd.control.membership import read_members
from vnetd.errors import RegistryUnavailable
from vnetd.model import Member
from vnetd.registry.access import security_of
from vnetd.registry.base import Registry
from vnetd.registry.etcd import EtcdSecurity, open_etcd_registry
from vnetd.spec import MeshSpec

RegistryOpener = Callable[[Sequence[str]], AbstractAsyncContextManager[Registry]]

READ_TIMEOUT = 10.0


def read_members_now(
    spec: MeshSpec,
    open_registry: RegistryOpener | None = None,
    timeout: float = READ_TIMEOUT,
) -> tuple[dict[int, Member], int]:
    """The members registered now and the number of bad entries skipped.

    Runs its own ``trio.run``: call it from synchronous code only.

    Args:
        open_registry: opens a registry on ``spec.registry.endpoints``;
            etcd with the spec's TLS and auth settings when None.
        timeout: the bound of the whole read, seconds.

    Raises:
        RegistryUnavailable: no answer within ``timeout``, or no endpoint
            reachable; the message names the endpoints and the fix.
    """
    return trio.run(_read, spec, open_registry or _etcd_opener(spec), timeout)


def _etcd_opener(spec: MeshSpec) -> RegistryOpener:
    security = security_of(spec.registry)
    if security == EtcdSecurity():
        return open_etcd_registry

    def open_registry(endpoints: Sequence[str]) -> AbstractAsyncContextManager[Registry]:
        return open_etcd_registry(endpoints, security)

    return open_registry


async def _read(
    spec: MeshSpec, open_registry: RegistryOpener, seconds: float
) -> tuple[dict[int, Member], int]:
    endpoints = ", ".join(spec.registry.endpoints)
    fix = f"check that etcd runs at {endpoints}, or pass --etcd URL"
    try:
        with trio.fail_after(seconds):
            async with open_registry(spec.registry.endpoints) as registry:
                return await read_members(registry, spec)
    except trio.TooSlowError:
        raise RegistryUnavailable(
            f"reading the members of mesh {spec.name}: no answer within {seconds:g} s; {fix}"
        ) from None
    except RegistryUnavailable as exc:
        raise RegistryUnavailable(
            f"reading the members of mesh {spec.name}: {exc}; {fix}"
        ) from None
