"""pyroute2's modules without its package ``__init__``, which imports all of them.

pyroute2's ``__init__`` imports every module it has (NDB with sqlite3, IPDB,
conntrack, nl80211, IPVS, plan9, ...) to re-export their classes; the data
plane uses three of them. ``defer_package_init`` registers the package without
running that ``__init__``, so ``from pyroute2.iproute.linux import IPRoute``
loads only what IPRoute needs (measured with pyroute2 0.9.7: 99 instead of 163
of its modules, about 6 MiB less resident, tens of ms less CPU at start; see
docs/architecture.md, "Start-up"). The first attribute asked of the package
itself (``from pyroute2 import NDB``, ``pyroute2.__version__``) runs the real
``__init__`` then, so code that imports the package the usual way is unaffected.

The data plane's modules import pyroute2's names from here (the deferral then
always comes first); the rest of pyroute2 they import from its own modules.
``IPRoute`` itself is imported at its first use (a module ``__getattr__``).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

PACKAGE = "pyroute2"


def defer_package_init() -> None:
    """Register pyroute2 with its ``__init__`` deferred to its first attribute access;
    nothing when it is already imported or not installed."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def run_init(name: str) -> object:
        if importlib.util.find_spec(f"{PACKAGE}.{name}") is not None:
            # ``from pyroute2 import config`` asks for the attribute first: a
            # submodule is left to the import system, which then imports it.
            raise AttributeError(name)
        del package.__dict__["__getattr__"]
        loader.exec_module(package)
        return getattr(package, name)

    package.__dict__["__getattr__"] = run_init
    sys.modules[PACKAGE] = package


defer_package_init()

from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402 (after the deferral)

if TYPE_CHECKING:
    from pyroute2.iproute.linux import IPRoute

__all__ = ["IPRoute", "NetlinkError", "defer_package_init"]


def __getattr__(name: str) -> object:
    """``IPRoute``, imported at its first use: its modules cost about 35 ms of CPU, and
    the daemon's start sets its device up without it (``link_socket``)."""
    if name == "IPRoute":
        from pyroute2.iproute.linux import IPRoute

        return IPRoute
    raise AttributeError(name)


def package_init_ran(module: ModuleType | None = None) -> bool:
    """Whether pyroute2's ``__init__`` has run (for the tests)."""
    package = module or sys.modules.get(PACKAGE)
    return package is not None and "__getattr__" not in package.__dict__
