"""How every command reaches etcd: the client built from resolved ``[registry]`` settings.

The flags, their precedence and the secrets are resolved in ``vnetd.config``
(``with_etcd_access``); this module only opens the client, so ``vnetd up``,
``wait``, ``status`` and ``render wg-quick`` reach etcd the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from vnetd.spec import MeshSpec, RegistrySpec

if TYPE_CHECKING:  # the CLI builds its parsers without importing httpx
    from vnetd.registry.base import Registry
    from vnetd.registry.etcd import EtcdRegistry, EtcdSecurity


def security_of(registry: RegistrySpec) -> EtcdSecurity:
    """The client's TLS files and credentials from resolved ``[registry]`` settings."""
    from vnetd.registry.etcd import EtcdSecurity

    return EtcdSecurity(
        ca_file=Path(registry.ca_file) if registry.ca_file else None,
        cert_file=Path(registry.cert_file) if registry.cert_file else None,
        key_file=Path(registry.key_file) if registry.key_file else None,
        username=registry.username,
        password=registry.password,
    )


def open_registry_for(spec: MeshSpec) -> AbstractAsyncContextManager[EtcdRegistry]:
    """An etcd client for ``spec``'s registry settings (after ``with_etcd_access``)."""
    from vnetd.registry.etcd import open_etcd_registry

    return open_etcd_registry(spec.registry.endpoints, security_of(spec.registry))


def secured_opener(
    spec: MeshSpec,
) -> Callable[[Sequence[str]], AbstractAsyncContextManager[Registry]]:
    """An opener of etcd at given endpoints with ``spec``'s TLS and auth settings."""
    from vnetd.registry.etcd import open_etcd_registry

    security = security_of(spec.registry)

    def open_registry(endpoints: Sequence[str]) -> AbstractAsyncContextManager[Registry]:
        return open_etcd_registry(endpoints, security)

    return open_registry
