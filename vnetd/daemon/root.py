"""The daemon's root nursery: device, spec check, claim, watch, reconcile, shutdown.

It runs from ``DaemonSettings``, every input resolved before it starts
(``vnetd.daemon_settings``); nothing here reads the environment or asks the
host for a setting. Start-up order: the device comes up first with the rank's fixed address,
so the address exists even while the registry is still unreachable; then
the registry is opened, the stored spec checked, the rank claimed, the
members watched and the reconciler started (``vnetd.daemon.control_plane``). On SIGTERM
or SIGINT, or once the ``--exit-on-file`` file exists (a launcher's "job
done" marker), the lease is revoked (peers drop this rank at once),
wireguard-go is stopped and the link removed.

A launcher waits for that address, so what comes after it is imported after
it: ``vnetd.daemon.control_plane`` (the control plane) and the registry's client once the
device is up, the HTTP endpoints and prometheus-client only when ``[http]
listen`` is set (docs/architecture.md, "Start-up").
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from vnetd import gc_pause
from vnetd.control.membership import check_pinned_signer
from vnetd.control.proof import open_signer
from vnetd.control.rank_cert import check_own_cert
from vnetd.control.retry import RegistryHealth, retry_registry
from vnetd.daemon_settings import DaemonSettings
from vnetd.dataplane.base import Dataplane, DeviceConfig, device_id_of
from vnetd.dataplane.select import DataplaneFactory, choose_dataplane
from vnetd.errors import VnetdError, plain_errors
from vnetd.keys import load_or_create_key
from vnetd.logs import set_rank
from vnetd.model import Member
from vnetd.registry import RegistryOpener
from vnetd.registry import open_registry as open_settings_registry
from vnetd.spec import DEFAULT_SITE, MeshSpec

if TYPE_CHECKING:  # imported when used: see the module doc
    from vnetd.control.proof import Signer
    from vnetd.daemon.running import Running
    from vnetd.observe.endpoints import DaemonEndpoints

log = logging.getLogger("vnetd.daemon")

EXIT_FILE_POLL = 0.5
"""How often (s) the exit file is looked for: trio has no portable file watch, and
one ``stat`` per half second is nothing next to a job's run time."""


def prepare(
    settings: DaemonSettings, rank: int, signer: tuple[Signer, str] | None = None
) -> tuple[Member, DeviceConfig, Signer]:
    """This rank's record, device config and record signer (the keys are read or made
    in the state dir); every failure is a ``VnetdError``.

    Args:
        rank: the record's rank, or the one the registry assigned (``--rank auto``).
        signer: the record signer and where it is from, already opened
            (``daemon_signer``); None: opened here.
    """
    set_rank(rank)
    keys = load_or_create_key(settings.state_dir)
    key, source = signer or daemon_signer(settings)
    check_pinned_signer(settings.spec, rank, key.public_key, source)
    me = settings.member(rank, keys.public_key, key.public_key, started=time.time())
    cert_source = settings.rank_cert.named if settings.rank_cert else ""
    check_own_cert(settings.spec, rank, key.public_key, me.cert, cert_source)
    return me, device_config(settings, rank, keys.private_key), key


def device_config(settings: DaemonSettings, rank: int, private_key: str) -> DeviceConfig:
    """The device of ``rank`` as ``settings`` say: its addresses are the rank's."""
    spec = settings.spec
    return DeviceConfig(
        interface=spec.interface,
        private_key=private_key,
        listen_port=_port_of(settings.endpoint, spec.port),
        address=spec.interface_address(rank),
        network=spec.network,
        mtu=settings.mtu,
        persistent_keepalive=spec.persistent_keepalive,
        preshared_key=settings.preshared_key,
        address6=spec.interface_address6(rank),
        network6=spec.network6,
        max_peers=spec.size - 1,
        wireguard_log=settings.wireguard_log,
        child_env=settings.child_env,
    )


def daemon_signer(settings: DaemonSettings) -> tuple[Signer, str]:
    """The record signing key ``vnetd up`` signs with, and where it is from: the file
    ``--signing-key-file`` (or its variable or spec key) names, else ``signing.key``
    in the state dir (made on first start)."""
    named = settings.signing_key_file
    signer, source = open_signer(named, settings.state_dir)
    assert signer is not None  # a state dir is always given
    if named is not None:
        log.info("record signing key %s from %s", signer.public_key, source)
    return signer, source


def _port_of(endpoint: str, default: int) -> int:
    port = endpoint.rpartition(":")[2]
    return int(port) if port.isdigit() else default


async def run_daemon(
    settings: DaemonSettings,
    *,
    open_dataplane: DataplaneFactory | None = None,
    open_registry: RegistryOpener = open_settings_registry,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled. Signals are the caller's: see ``run_until_signal``.

    Returns once the exit file (``--exit-on-file``, ``VNETD_EXIT_ON_FILE``)
    exists, after the same graceful shutdown as a cancellation.

    Raises:
        VnetdError: bad input, a spec that differs from the registry's, or a
            data plane that cannot be set up.
    """
    exit_file = settings.exit_file
    if exit_file is None:
        await _run_daemon(settings, open_dataplane, open_registry, task_status)
        return
    if _exists(exit_file):  # a container restarted after its job ended
        log.info("%s exists: the job is done; not starting", exit_file)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_when_exists, exit_file, nursery.cancel_scope)
        await _run_daemon(settings, open_dataplane, open_registry, task_status)
        nursery.cancel_scope.cancel()


def _exists(path: Path) -> bool:
    # One stat on the event loop, not in a thread: the marker is on a local volume
    # (an emptyDir), where a stat takes microseconds, less than a thread hop.
    return path.exists()


async def _cancel_when_exists(path: Path, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once ``path`` exists."""
    while True:
        if _exists(path):
            break
        await trio.sleep(EXIT_FILE_POLL)
    log.info("%s exists: the job is done; shutting down", path)
    scope.cancel()


async def _run_daemon(
    settings: DaemonSettings,
    open_dataplane: DataplaneFactory | None,
    open_registry: RegistryOpener,
    task_status: trio.TaskStatus[Running],
) -> None:
    opened = None
    if isinstance(settings.rank, int):
        rank = settings.rank
    else:  # --rank auto. The signing key first: a rank pinned to another key is never assigned.
        opened = await trio.to_thread.run_sync(daemon_signer, settings)
        rank = await _auto_rank(settings, open_registry, opened[0].public_key)
    me, config, signer = await trio.to_thread.run_sync(prepare, settings, rank, opened)
    spec = settings.spec
    log.info(
        "starting: rank %d address %s on %s, endpoint %s, instance %s, registry %s",
        me.rank,
        config.describe_addresses(),
        config.interface,
        me.endpoint,
        me.instance,
        ",".join(spec.registry.endpoints),
    )
    plain = [url for url in spec.registry.endpoints if url.startswith("http://")]
    if spec.registry.username and plain:
        log.warning(
            "etcd user %s: its password goes over plain http to %s; use https:// endpoints "
            '(docs/security.md, "etcd over TLS")',
            spec.registry.username,
            ",".join(plain),
        )
    if me.site != DEFAULT_SITE or me.public_endpoint:
        log.info("site %s, public endpoint %s", me.site, me.public_endpoint or "none")
    # The probe service binds the overlay address, which only a chosen (real) data plane
    # puts on a link; a data plane handed in (the tests' fakes) gets none.
    probes = bool(spec.doctor_port) and open_dataplane is None
    if open_dataplane is None:
        open_dataplane = await choose_dataplane(settings.dataplane, spec, config.interface)
    endpoints = _endpoints(spec, me) if spec.http.listen else None
    with plain_errors():
        async with trio.open_nursery() as nursery:
            if endpoints is not None:
                await nursery.start(_serve_http, spec.http.listen, endpoints)
            async with open_dataplane(config) as dataplane:
                if endpoints is not None:
                    endpoints.attach_dataplane(dataplane)
                from vnetd.daemon.control_plane import (  # after the address: module doc
                    Started,
                    run_control_plane,
                )

                me = replace(me, device_id=device_id_of(dataplane))
                on_pass = endpoints.daemon_metrics.observe_pass if endpoints else None
                async with open_registry(spec.registry) as registry, trio.open_nursery() as inner:
                    # The probe service starts once the rank is claimed: nothing asks it
                    # before the rank is registered, and its import is no start-up cost.
                    probe = partial(_serve_probes, spec, me, config.mtu, dataplane, endpoints)

                    def then(running: Running) -> None:
                        inner.start_soon(
                            _after_claim, running.claim.claimed, probe if probes else None, inner
                        )

                    started = Started(task_status, endpoints, then)
                    await run_control_plane(
                        settings, me, registry, dataplane, on_pass, started, signer
                    )
                    inner.cancel_scope.cancel()
            nursery.cancel_scope.cancel()


AFTER_CLAIM = 1.0
"""Seconds after the claim before the paused collector's one full collection: the
peers that learn of us then start their handshakes, which we answer first."""


async def _after_claim(
    claimed: trio.Event,
    probes: Callable[..., Awaitable[None]] | None,
    nursery: trio.Nursery,
) -> None:
    """What waits for the claim, or ``gc_pause.MAX_PAUSE`` s: the probe service, then
    (``AFTER_CLAIM`` s later) the collector paused for the start (``vnetd.gc_pause``)."""
    with trio.move_on_after(gc_pause.MAX_PAUSE):
        await claimed.wait()
    if probes is not None:
        nursery.start_soon(probes)
    await trio.sleep(AFTER_CLAIM)
    gc_pause.resume()


def _endpoints(spec: MeshSpec, me: Member) -> DaemonEndpoints:
    """The HTTP endpoints and their metrics (prometheus-client is imported here)."""
    from vnetd.observe.endpoints import DaemonEndpoints
    from vnetd.observe.metrics import DaemonMetrics

    return DaemonEndpoints(spec, me, DaemonMetrics())


async def _serve_http(
    listen: str,
    endpoints: DaemonEndpoints,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP endpoints; a listen address that cannot be bound is a ``VnetdError``."""
    from vnetd.observe.http import serve_http

    try:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_http, listen, endpoints)
            log.info("serving /healthz /readyz /metrics /status at %s", ", ".join(bound))
            task_status.started()
    except* OSError as group:
        error = group.exceptions[0]
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise VnetdError(f"http listen {listen}: cannot serve there: {why}") from None


async def _serve_probes(
    spec: MeshSpec,
    me: Member,
    mtu: int,
    dataplane: Dataplane,
    endpoints: DaemonEndpoints | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The doctor's probe service on the overlay address (``mesh.doctor_port``); a black
    hole it finds shows in ``/status`` and ``/metrics`` when they are served."""
    from vnetd.daemon.probe_service import ProbeService

    on_black_hole = endpoints.black_hole if endpoints is not None else None
    service = ProbeService(spec, me, mtu, dataplane, on_black_hole)
    if endpoints is not None:
        endpoints.mesh_gate.row_source = service.rows_about  # the gate's verdict
    await service.serve(task_status=task_status)


async def _auto_rank(
    settings: DaemonSettings, open_registry: RegistryOpener, signing_key: str
) -> int:
    """This node's sticky rank from the registry, waiting for etcd as long as it takes;
    never a rank the spec pins to a signing key other than ``signing_key``."""
    from vnetd.control.assign import assign_rank

    spec = settings.spec
    node = settings.instance
    with plain_errors():
        async with open_registry(spec.registry) as registry:
            return await retry_registry(
                "rank assignment",
                lambda: assign_rank(registry, spec, node, signing_key),
                RegistryHealth(),
            )


async def run_until_signal(settings: DaemonSettings) -> None:
    """The process's entry point: run the daemon until SIGTERM or SIGINT.

    Signal handlers are process-wide, so they are installed here, once, and
    not by ``run_daemon``, which tests run several times in one process.
    """
    with plain_errors(), trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as root:
            root.start_soon(_cancel_on_signal, signals, root.cancel_scope)
            await run_daemon(settings)
            root.cancel_scope.cancel()
    log.info("stopped")


async def _cancel_on_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
    async for signum in signals:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        scope.cancel()
        return
