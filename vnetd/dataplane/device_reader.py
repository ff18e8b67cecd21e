"""Read this host's WireGuard device, userspace or kernel, read-only: ``read_device``.

Used by ``vnetd status`` (the device columns) and ``vnetd wait --reachable``
(the peers: which holds each rank's address, and its handshake). Where
wireguard-go answers on ``<socket dir>/<interface>.sock`` (shared with the
container that runs ``vnetd up``), one ``get`` on it;
otherwise the kernel's WireGuard device of that name, through generic netlink
(``wg_netlink``, imported only then). Both give the same ``LocalDevice``, read by
the data planes' own parsers (``uapi_protocol.parse_device``,
``wg_netlink.parse_dump``). The daemon's ``/status`` reads its open ``Dataplane``
instead. See docs/architecture.md (data plane).

Either answer carries the device's private key. It is turned into the public
key at once and dropped: no record here holds it, so nothing that prints one
of them can leak it (invariant 7).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vnetd.dataplane.codec.uapi_protocol import SOCKET_DIR, DeviceState, parse_device, socket_path
from vnetd.dataplane.wireguard_go.uapi_client import UapiClient
from vnetd.errors import DataplaneError
from vnetd.keys import public_key_of
from vnetd.model import DevicePeer

if TYPE_CHECKING:  # kernel imports pyroute2 and wg_netlink: only when there is no socket to read
    from vnetd.dataplane.kernel.device import WgFactory

READ_TIMEOUT = 2.0
"""One UAPI request/response, or one netlink read, seconds."""

_NO_KERNEL_DEVICE = (errno.ENODEV, errno.ENOENT, errno.EOPNOTSUPP)
"""The link went away between its lookup and the read (or the module did)."""
_DENIED = (errno.EPERM, errno.EACCES)


@dataclass(frozen=True)
class LocalDevice:
    """What the device reports, minus its private key."""

    public_key: str | None
    """The device's own public key (None when it has no private key set)."""
    listen_port: int | None
    peers: dict[str, DevicePeer] = field(default_factory=dict)
    """The peers, keyed by base64 public key, with handshake time and counters."""


async def read_device(
    interface: str,
    socket_dir: Path = Path(SOCKET_DIR),
    *,
    timeout: float = READ_TIMEOUT,  # noqa: ASYNC109 (a per-request bound, as UapiClient's)
    netns: str | None = None,
    wg_factory: WgFactory | None = None,
    max_peers: int = 0,
) -> LocalDevice:
    """The WireGuard device ``interface``: wireguard-go's when its socket in
    ``socket_dir`` answers, else the kernel's.

    Args:
        max_peers: the most peers the device may hold (the mesh's size less one): a
            kernel dump gets ``kernel.DUMP_ALLOWANCE`` s more per peer (a loaded TCG
            guest took 18 s for 1000 through pyroute2's decoder).
        netns: read a kernel device in this network namespace (tests; the
            commands run in the pod's own).
        wg_factory: opens the WireGuard netlink socket (default
            ``kernel.open_wireguard``; a fake in tests).

    Raises:
        DataplaneError: neither is there (the message says what to check),
            no answer within ``timeout`` s, or the device refused.
    """
    path = Path(socket_path(interface, socket_dir))
    state = await _read_uapi(path, timeout)
    if state is None:
        from vnetd.dataplane.kernel.device import DUMP_ALLOWANCE

        bound = timeout + DUMP_ALLOWANCE * max_peers
        state = await _read_kernel(interface, path, bound, netns, wg_factory)
    private_key, listen_port, peers = state
    return LocalDevice(_public_key(private_key), listen_port, peers)


async def read_local_device(
    path: Path,
    timeout: float = READ_TIMEOUT,  # noqa: ASYNC109 (as read_device's)
    max_peers: int = 0,
) -> LocalDevice:
    """``read_device`` for the interface whose socket would be ``path``
    (``<wireguard-dir>/<interface>.sock``, as ``status`` and ``wait`` name it)."""
    interface = path.name.removesuffix(".sock")
    return await read_device(interface, path.parent, timeout=timeout, max_peers=max_peers)


def _no_device(path: Path) -> DataplaneError:
    return DataplaneError(
        f"no WireGuard device at {path} (is vnetd up running, and is "
        "--wireguard-dir the directory it shares?)"
    )


async def _read_uapi(path: Path, timeout: float) -> DeviceState | None:  # noqa: ASYNC109
    """One ``get`` on the socket; None when no wireguard-go serves it."""
    try:
        return parse_device(await UapiClient(str(path), timeout=timeout).get())
    except DataplaneError as exc:
        if isinstance(exc.__cause__, FileNotFoundError | ConnectionRefusedError):
            return None
        raise


async def _read_kernel(
    interface: str,
    path: Path,
    timeout: float,  # noqa: ASYNC109
    netns: str | None,
    wg_factory: WgFactory | None,
) -> DeviceState:
    """One dump of the kernel's device, in a worker thread.

    The link's kind is looked up first: without a ``wireguard`` link there is
    nothing to ask the WireGuard family (which may not exist at all).
    """
    from vnetd.dataplane.kernel import device as kernel
    from vnetd.dataplane.rtnetlink import link_reads

    open_wireguard = wg_factory or kernel.open_wireguard

    def info() -> DeviceState | None:
        if link_reads.link_kind(netns, interface) != "wireguard":
            return None
        wg = open_wireguard(netns)
        try:
            return kernel.parse_dump(wg.dump(interface))
        finally:
            wg.close()

    try:
        state = await link_reads.run_netlink(info, timeout)
    except DataplaneError as exc:
        code = getattr(exc.__cause__, "code", None)
        if code in _DENIED:
            raise DataplaneError(
                f"kernel WireGuard device {interface}: reading it needs CAP_NET_ADMIN "
                "(run as root, beside vnetd up)"
            ) from None
        if code not in _NO_KERNEL_DEVICE:
            raise
        state = None
    if state is None:
        raise _no_device(path)
    return state


def _public_key(private_key: str | None) -> str | None:
    if private_key is None:
        return None
    try:
        return public_key_of(private_key)
    except ValueError:
        return None
