"""The data-plane seam: a WireGuard device vnetd adds and removes peers on."""

from vnetd.dataplane.base import Dataplane, DeviceConfig

__all__ = ["Dataplane", "DeviceConfig"]
