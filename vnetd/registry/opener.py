"""The registry port's one way in: ``open_registry(settings)`` opens the registry that
resolved ``[registry]`` settings name (docs/architecture.md, "Module map").

With ``[registry] relays``, the members are read through relays and all else from etcd
(``relay.reads``); the member watch on etcd itself goes over its JSON gateway or native
gRPC (``[registry] watch``). Only etcd exists today; another backend is chosen here and
nowhere else. The backend is imported when a registry is opened, so the CLI builds its
parsers without importing httpx (nor grpcio, imported only for a gRPC watch).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from vnetd.registry.base import Registry
from vnetd.spec import RegistrySpec

if TYPE_CHECKING:
    from vnetd.registry.etcd.security import SharedTls

RegistryOpener = Callable[[RegistrySpec], AbstractAsyncContextManager[Registry]]
"""What opens a registry from settings: ``open_registry``, or a test's memory registry."""


def open_registry(
    settings: RegistrySpec, *, shared_tls: SharedTls | None = None
) -> AbstractAsyncContextManager[Registry]:
    """The registry ``settings`` name (TLS and auth already resolved), closed on exit.

    Args:
        shared_tls: TLS contexts shared with the other registries of this
            process (``sharing_tls``); None: the client builds its own.

    Raises:
        RegistryError: the settings cannot make a client (no endpoint, an
            unreadable TLS file).
    """
    from vnetd.registry.etcd.client import open_etcd_registry
    from vnetd.registry.etcd.security import security_of

    direct: AbstractAsyncContextManager[Registry]
    if settings.watch == "grpc":
        from vnetd.registry.etcd.grpc_watch import open_grpc_watch_registry

        direct = open_grpc_watch_registry(settings, shared_tls=shared_tls)
    else:
        direct = open_etcd_registry(
            settings.endpoints,
            security_of(settings),
            lease_ttl=settings.lease_ttl,
            shared_tls=shared_tls,
        )
    if not settings.relays:
        return direct
    return _with_relays(direct, settings)


@asynccontextmanager
async def _with_relays(
    direct: AbstractAsyncContextManager[Registry], settings: RegistrySpec
) -> AsyncIterator[Registry]:
    """``direct`` with the members read through ``settings.relays`` (``relay.reads``).
    The relays get the TLS files but no etcd user: they serve reads to anyone who can
    reach them, and the records they serve are signed."""
    from vnetd.registry.etcd.client import open_etcd_registry
    from vnetd.registry.etcd.security import security_of
    from vnetd.registry.relay.reads import RelayedRegistry, members_prefixes

    tls_only = replace(security_of(settings), username=None, password=None)
    async with direct as etcd, open_etcd_registry(settings.relays, tls_only) as relays:
        yield RelayedRegistry(etcd, relays, members_prefixes(settings.prefix))


def sharing_tls() -> RegistryOpener:
    """An opener whose registries share their TLS contexts: for a process that runs
    many daemons (``run_daemon(open_registry=...)``), each then pays 0.1 ms instead
    of 5-20 ms of CPU for its client (``etcd.security.SharedTls``)."""
    from vnetd.registry.etcd.security import SharedTls

    shared = SharedTls()

    def opener(settings: RegistrySpec) -> AbstractAsyncContextManager[Registry]:
        return open_registry(settings, shared_tls=shared)

    return opener
