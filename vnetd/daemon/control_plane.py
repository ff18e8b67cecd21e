"""The daemon once its device is up: spec check, member watch, reconciler, claim.

``vnetd.daemon.root`` imports this module only after the device has the rank's
address, so the control plane's modules are not on the path a launcher
waits on (docs/architecture.md, "Start-up"). Its lines are logged under
``vnetd.daemon``, the logger they have always had.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from vnetd.control.claim import ClaimHolder
from vnetd.control.endpoint_file import follow_public_endpoint
from vnetd.control.membership import ensure_spec, spec_key
from vnetd.control.proof import Signer
from vnetd.control.rank_cert import follow_rank_cert
from vnetd.control.retry import RegistryHealth, retry_registry
from vnetd.control.watcher import MemberView, sync_members
from vnetd.daemon.doorbell import serve_doorbell
from vnetd.daemon.reconciler import Reconciler
from vnetd.daemon.running import Running
from vnetd.daemon_settings import DaemonSettings
from vnetd.dataplane.base import Dataplane, RestartingDataplane, device_id_of
from vnetd.identity import read_rank_cert
from vnetd.model import Member
from vnetd.registry import Registry
from vnetd.spec import MeshSpec

if TYPE_CHECKING:  # the endpoints import prometheus-client: only with [http] listen
    from vnetd.observe.endpoints import DaemonEndpoints

log = logging.getLogger("vnetd.daemon")

PEERS_BEFORE_CLAIM = 5.0
"""How long the claim waits for the known peers to be on the device (etcd may be down)."""


class Started:
    """Hands the running daemon to both the caller and the HTTP endpoints (if served)."""

    def __init__(
        self,
        task_status: trio.TaskStatus[Running],
        endpoints: DaemonEndpoints | None,
        then: Callable[[Running], None] | None = None,
    ) -> None:
        self.task_status = task_status
        self.endpoints = endpoints
        self.then = then
        """Called once the claim runs: what the daemon starts after it, not before."""

    def started(self, running: Running) -> None:
        if self.endpoints is not None:
            self.endpoints.attach(running)
        self.task_status.started(running)
        if self.then is not None:
            self.then(running)


async def run_control_plane(
    settings: DaemonSettings,
    me: Member,
    registry: Registry,
    dataplane: Dataplane,
    on_pass: Callable[[float, int], None] | None,
    task_status: Started,
    signer: Signer | None = None,
) -> None:
    """Check the spec, watch the members, reconcile, claim the rank; until cancelled.

    ``on_pass`` is the metrics' pass observer (None without metrics); ``signer``
    signs our records (None: unsigned, as older versions wrote them).
    """
    spec = settings.spec
    health = RegistryHealth()
    await _check_spec(registry, spec, health)
    view = MemberView()
    claim = ClaimHolder(registry, spec, me, health, view, signer)
    reconciler = Reconciler(
        spec,
        me.rank,
        me.public_key,
        view,
        dataplane,
        resync_interval=settings.resync_interval,
        on_pass=on_pass,
    )
    if isinstance(dataplane, RestartingDataplane):

        def restarted(reason: str) -> None:
            # The new device id is registered once the peers are back on the device,
            # as the claim waits for them at start: peers that see it re-add us and
            # start a handshake at once, which the device must be able to answer.
            reconciler.request_resync(
                reason, then=lambda: claim.set_device_id(device_id_of(dataplane))
            )

        dataplane.on_restart = restarted
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sync_members, registry, spec, view, health)
            await nursery.start(reconciler.run)
            if spec.tree_fanout:  # lazy pairs ring us before they know a session
                await nursery.start(serve_doorbell, spec.doorbell_port, reconciler.ring)
            # Peers first, then the claim: whoever learns of us from the
            # registry then finds itself already a peer on our device, and
            # its first handshake is answered instead of dropped.
            with trio.move_on_after(PEERS_BEFORE_CLAIM):
                await reconciler.wait_synced()
            await nursery.start(claim.run)
            if settings.public_endpoint_file is not None:
                nursery.start_soon(follow_public_endpoint, settings.public_endpoint_file, claim)
            if settings.rank_cert is not None and spec.rank_ca:
                read = partial(read_rank_cert, settings.rank_cert.path)
                nursery.start_soon(follow_rank_cert, read, settings.rank_cert.named, spec, claim)
            task_status.started(Running(spec, me, view, claim, reconciler, dataplane, health))
    finally:
        await claim.release()


async def _check_spec(registry: Registry, spec: MeshSpec, health: RegistryHealth) -> None:
    stored = await retry_registry("spec check", lambda: ensure_spec(registry, spec), health)
    log.info("spec %s at %s", "stored" if stored else "matches the one", spec_key(spec))
