"""The data-plane port's ways in: ``choose_dataplane`` (``--dataplane``, else the spec's
``[wireguard] dataplane``, ``auto`` probing the host) and ``open_dataplane`` for a
known kind (docs/architecture.md, "Kernel data plane and the choice").

The backends are imported when one is chosen, so importing the port loads no
pyroute2. The choice is logged under ``vnetd.daemon``, the logger these lines
have always had (JSON logs name it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from vnetd.dataplane.base import Dataplane, DeviceConfig
from vnetd.errors import VnetdError
from vnetd.spec import DATAPLANE_KINDS, MeshSpec

log = logging.getLogger("vnetd.daemon")

DataplaneFactory = Callable[[DeviceConfig], AbstractAsyncContextManager[Dataplane]]
"""What opens a configured device: a backend's ``open_*_dataplane``, or a test's fake."""


async def choose_dataplane(
    flag: str | None, spec: MeshSpec, interface: str, netns: str | None = None
) -> DataplaneFactory:
    """The data plane to run: ``--dataplane``, else the spec's ``[wireguard] dataplane``.

    ``auto`` keeps the kind of a link this interface already has (a device
    left by a killed daemon, to adopt), else uses the kernel's WireGuard when
    a probe link can be created, else wireguard-go; it logs which and why.

    Raises:
        VnetdError: ``kernel`` was asked for and the kernel has no WireGuard.
    """
    from vnetd.dataplane.rtnetlink.link import kernel_unavailable
    from vnetd.dataplane.rtnetlink.link_reads import existing_link_kind

    kind = flag or spec.local.dataplane
    source = "--dataplane" if flag else "[wireguard] dataplane"
    if kind == "auto":
        existing = await existing_link_kind(netns, interface)
        if existing in ("wireguard", "tun"):
            kind = "kernel" if existing == "wireguard" else "userspace"
            log.info("data plane: %s (auto: %s already has a %s link)", kind, interface, existing)
            return dataplane_factory(kind)
        reason = await kernel_unavailable(netns)
        if reason is None:
            log.info("data plane: kernel WireGuard (auto: a wireguard link can be created)")
            return dataplane_factory("kernel")
        log.info("data plane: kernel WireGuard unavailable (%s); using wireguard-go", reason)
        return dataplane_factory("userspace")
    if kind == "kernel":
        reason = await kernel_unavailable(netns)
        if reason is not None:
            raise VnetdError(
                f"{source}: kernel WireGuard unavailable ({reason}); "
                "use auto or userspace (wireguard-go)"
            )
    log.info("data plane: %s (%s %s)", kind, source, kind)
    return dataplane_factory(kind)


def dataplane_factory(kind: str) -> DataplaneFactory:
    """The opener of the ``kernel``, ``userspace`` (wireguard-go) or ``fake`` data plane.

    Raises:
        VnetdError: another kind (``auto`` is ``choose_dataplane``'s).
    """
    if kind == "userspace":
        from vnetd.dataplane.wireguard_go.device import open_uapi_dataplane

        return open_uapi_dataplane
    if kind == "kernel":
        from vnetd.dataplane.kernel.device import open_kernel_dataplane

        return open_kernel_dataplane
    if kind == "fake":
        from vnetd.dataplane.fake import open_fake_dataplane

        return open_fake_dataplane
    raise VnetdError(f"--dataplane: {kind!r} is not one of {', '.join(DATAPLANE_KINDS)}")


def open_dataplane(kind: str, config: DeviceConfig) -> AbstractAsyncContextManager[Dataplane]:
    """A device of a known ``kind`` (see ``dataplane_factory``), up and configured
    as ``config`` says on entry, removed on exit."""
    return dataplane_factory(kind)(config)
