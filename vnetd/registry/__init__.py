"""The registry seam: a small key-value protocol with leases and watches."""

from vnetd.registry.base import KeyValue, Registry, WatchEvent

__all__ = ["KeyValue", "Registry", "WatchEvent"]
