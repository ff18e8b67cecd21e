"""The registry port: a small key-value protocol with leases and watches, and
``open_registry``, the one way to open a backend from ``[registry]`` settings."""

from vnetd.registry.base import KeyValue, Registry, WatchEvent
from vnetd.registry.opener import RegistryOpener, open_registry, sharing_tls

__all__ = [
    "KeyValue",
    "Registry",
    "RegistryOpener",
    "WatchEvent",
    "open_registry",
    "sharing_tls",
]
