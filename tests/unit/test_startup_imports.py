"""What ``vnetd up`` imports before the rank's address is on the interface.

A launcher waits on that address, so the modules on its path are only the
ones the device needs; the rest is imported after it or when configured
(docs/architecture.md, "Start-up"). Each check runs in a fresh interpreter.
What the set-up imports when it runs (not only when its modules load) is checked
against the kernel by ``tests/contract/test_link_setup.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from vnetd.cli import command_of

UP_PATH = """
import sys
from vnetd.cli import main
try:
    main(["--log-level", "INFO", "up", "--help"])
except SystemExit:
    pass
import trio, vnetd.daemon.root, vnetd.dataplane.select, vnetd.dataplane.wireguard_go.device
print(" ".join(sorted(sys.modules)))
"""
KERNEL_PATH = UP_PATH.replace(
    "vnetd.dataplane.wireguard_go.device", "vnetd.dataplane.kernel.device"
)

NOT_BEFORE_THE_ADDRESS = (
    "hypercorn",  # the HTTP server: only with [http] listen
    "prometheus_client",  # metrics: only with [http] listen
    "vnetd.observe.metrics",
    "vnetd.observe.endpoints",
    "httpx",  # the registry client: opened once the device is up
    "vnetd.registry.etcd",
    "vnetd.daemon.control_plane",  # the control plane: after the device
    "vnetd.control.claim",
    "vnetd.daemon.reconciler",
    "vnetd.render",  # other commands
    "vnetd.commands.render.command",
    "vnetd.status",
    "vnetd.wait",
    "yaml",
    "pythonjsonlogger",  # text logs
    "pyroute2.ndb",  # pyroute2's package __init__ (NDB, IPDB, ...) did not run
    "pyroute2.ipdb",
    "sqlite3",
    "pyroute2.iproute",  # IPRoute: the set-up goes over link_socket
    "pyroute2.iproute.linux",
    "asyncio",  # pyroute2's core, which IPRoute brings
    "unittest",  # pyroute2's mock module, which IPRoute brings
    "cryptography.hazmat.primitives.serialization.ssh",  # the keys need raw bytes only
    "nacl",  # libsodium: the first peer's record to check brings it (control.proof)
)


def fresh_modules(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(result.stdout.split("\n")[-2].split())


def test_up_imports_only_what_the_device_needs():
    loaded = fresh_modules(UP_PATH)
    assert "vnetd.dataplane.rtnetlink.link_socket" in loaded
    assert sorted(set(NOT_BEFORE_THE_ADDRESS) & loaded) == []


def test_the_kernel_data_plane_brings_pyroute2_but_not_the_rest():
    loaded = fresh_modules(KERNEL_PATH)
    assert "vnetd.dataplane.kernel.wg_netlink" in loaded
    kernel_needs = {"asyncio", "pyroute2.iproute", "pyroute2.iproute.linux", "unittest"}
    assert sorted(set(NOT_BEFORE_THE_ADDRESS) - kernel_needs & loaded) == []


def test_pyroute2_package_still_imports_whole_when_asked():
    code = """
import sys
import vnetd.dataplane.rtnetlink.link
from vnetd.dataplane.rtnetlink.pyroute2_package import package_init_ran
before = package_init_ran()
from vnetd.dataplane.rtnetlink.pyroute2_package import IPRoute as lazy
import pyroute2
from pyroute2 import NDB, IPRoute
from pyroute2.netlink.generic.wireguard import WireGuard
print(before, package_init_ran(), IPRoute is lazy, pyroute2.WireGuard is WireGuard,
      bool(pyroute2.__version__))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "True", "True", "True", "True"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["up", "--config", "m.toml"], "up"),
        (["--log-level", "DEBUG", "--log-format=json", "up"], "up"),
        (["render", "flux", "--config", "up"], "render"),
        (["-h", "up"], None),
        (["--version"], None),
        (["--log-l", "DEBUG", "up"], None),  # an abbreviation: the full parser decides
        ([], None),
    ],
)
def test_command_of(argv: list[str], command: str | None):
    assert command_of(argv) == command
