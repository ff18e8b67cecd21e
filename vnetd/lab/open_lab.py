"""The netns lab: pods on one machine, a bridge, and etcd, all in namespaces.

Layout of a lab with id ``ab12`` (nothing lives in the root namespace)::

    vlab-ab12-sw     bridge br0; veth p0..pN-1 and "etcd" enslaved to it
    vlab-ab12-pod0   eth0 198.18.1.0/15, lo up, no default route
    vlab-ab12-pod1   eth0 198.18.1.1/15 ...
    vlab-ab12-etcd   eth0 198.18.0.10/15, etcd on :2379

``open_lab`` builds one and tears it down. The parts: ``Lab`` (module
``layout``), pods and their processes (``pods``), addresses and pinned
neighbours (``underlay``), and the markers that name each lab's owner
(``markers``); every name is importable from here too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from vnetd.lab.layout import Lab
from vnetd.lab.markers import (
    LAB_RUN_DIR,
    NETNS_PREFIX,
    TEARDOWN_TIMEOUT,
    claim_lab,
    cleanup_stale_labs,
)
from vnetd.lab.pods import KILL_WAIT, STOP_TIMEOUT, WG_RUN_DIR, LabError, LabProcess, Pod
from vnetd.lab.underlay import (
    ETCD_IP,
    ETCD_MAC,
    ETCD_PORT,
    FIRST_POD_IP,
    MAX_PODS,
    UNDERLAY6_PREFIX,
    UNDERLAY_PREFIXLEN,
)

__all__ = [
    "ETCD_IP",
    "ETCD_MAC",
    "ETCD_PORT",
    "FIRST_POD_IP",
    "KILL_WAIT",
    "LAB_RUN_DIR",
    "MAX_PODS",
    "NETNS_PREFIX",
    "STOP_TIMEOUT",
    "TEARDOWN_TIMEOUT",
    "UNDERLAY6_PREFIX",
    "UNDERLAY_PREFIXLEN",
    "WG_RUN_DIR",
    "Lab",
    "LabError",
    "LabProcess",
    "Pod",
    "cleanup_stale_labs",
    "open_lab",
]


@asynccontextmanager
async def open_lab(
    pods: int,
    *,
    workdir: Path | None = None,
    with_etcd: bool = True,
    mtu: int | None = None,
    ipv6: bool = False,
    static_neighbours: bool = False,
    etcd_members: int = 1,
    make: Callable[[str, Path], Lab] | None = None,
) -> AsyncIterator[Lab]:
    """Build a lab of ``pods`` pods (and etcd), yield it, and tear it all down.

    Args:
        pods: how many pods (1..1000); pod i has underlay address 198.18.1.0 + i.
        workdir: where pod dirs, logs and etcd data go; kept afterwards. None
            makes a temp dir that is removed on exit.
        with_etcd: start etcd now; otherwise call ``Lab.start_etcd`` later.
        mtu: the underlay MTU of the veths and the bridge (None: 1500).
        ipv6: give each pod an IPv6 underlay address too (``Pod.underlay_ip6``,
            ``fd00:198:18::<i+1>/64``); etcd stays on IPv4.
        static_neighbours: pin every underlay neighbour instead of resolving
            it by ARP; needed beyond ~30 pods (see module ``underlay``).
        etcd_members: 3 (or more) runs an etcd cluster, each member in its own
            namespace (``Lab.etcd_cluster``, module ``etcd_cluster``).
        make: builds another layout from ``(lab id, workdir)`` instead of ``Lab``
            (``lab.sites``); the other layout options are then its own.

    Raises:
        LabError: a namespace or link could not be made (all is undone).
        EtcdStartError: etcd did not start.

    Cancellation: teardown runs shielded, bounded by ``TEARDOWN_TIMEOUT``:
    processes get SIGTERM then SIGKILL by pid, namespaces are deleted, and the
    temp workdir is removed, also on an exception or cancellation.
    """
    if not 1 <= pods <= MAX_PODS:
        raise ValueError(f"pods must be 1..{MAX_PODS}, got {pods}")
    await cleanup_stale_labs()
    created = workdir is None
    lab_id, workdir = claim_lab(workdir)
    lab = make(lab_id, workdir) if make else Lab(
        lab_id, workdir, pods, mtu=mtu, ipv6=ipv6, static_neighbours=static_neighbours,
        etcd_members=etcd_members,
    )  # fmt: skip
    try:
        try:
            await lab._build()
        except Exception as exc:
            raise LabError(f"building lab {lab_id} failed: {exc}") from exc
        if with_etcd:
            await lab.start_etcd()
        yield lab
    finally:
        await lab._teardown(remove_workdir=created)
