"""The data-plane port: a WireGuard device vnetd adds and removes peers on, its
optional capabilities, and the ways to choose and open a backend.

pyroute2 is registered here with its package ``__init__`` deferred, before any
backend imports it (``pyroute2_package``).
"""

from vnetd.dataplane.pyroute2_package import defer_package_init

defer_package_init()

from vnetd.dataplane.base import (  # noqa: E402 (after defer_package_init)
    Dataplane,
    DeviceConfig,
    IdentifiedDataplane,
    RestartCountingDataplane,
    RestartingDataplane,
    device_id_of,
    restarts_of,
)
from vnetd.dataplane.select import (  # noqa: E402
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
