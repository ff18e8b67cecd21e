"""The data-plane port: a WireGuard device vnetd adds and removes peers on, its
optional capabilities, and the ways to choose and open a backend."""

from vnetd.dataplane.base import (
    Dataplane,
    DeviceConfig,
    IdentifiedDataplane,
    RestartCountingDataplane,
    RestartingDataplane,
    device_id_of,
    restarts_of,
)
from vnetd.dataplane.select import (
    DataplaneFactory,
    choose_dataplane,
    dataplane_factory,
    open_dataplane,
)

__all__ = [
    "Dataplane",
    "DataplaneFactory",
    "DeviceConfig",
    "IdentifiedDataplane",
    "RestartCountingDataplane",
    "RestartingDataplane",
    "choose_dataplane",
    "dataplane_factory",
    "device_id_of",
    "open_dataplane",
    "restarts_of",
]
