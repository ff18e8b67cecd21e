"""The daemon's root nursery: device, spec check, claim, watch, reconcile, shutdown.

Start-up order: the device comes up first with the rank's fixed address,
so the address exists even while the registry is still unreachable; then
the registry is opened, the stored spec checked, the rank claimed, the
members watched and the reconciler started (``vnetd.daemon.control_plane``). On SIGTERM
or SIGINT the lease is revoked (peers drop this rank at once), wireguard-go
is stopped and the link removed.

A launcher waits for that address, so what comes after it is imported after
it: ``vnetd.daemon.control_plane`` (the control plane) and the registry's client once the
device is up, the HTTP endpoints and prometheus-client only when ``[http]
listen`` is set (docs/architecture.md, "Start-up").
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from vnetd import __version__
from vnetd.config import Effective, Settings, effective
from vnetd.control.retry import RegistryHealth, retry_registry
from vnetd.dataplane import DataplaneFactory, DeviceConfig, choose_dataplane, device_id_of
from vnetd.dataplane.link import default_route_address, resolve_mtu
from vnetd.errors import VnetdError, plain_errors
from vnetd.identity import resolve_endpoint, resolve_instance, resolve_rank
from vnetd.keys import load_or_create_key
from vnetd.logs import set_rank
from vnetd.model import Member
from vnetd.registry import RegistryOpener
from vnetd.registry import open_registry as open_settings_registry
from vnetd.spec import DEFAULT_SITE, MeshSpec

if TYPE_CHECKING:  # imported when used: see the module doc
    from vnetd.daemon.running import Running
    from vnetd.observe.endpoints import DaemonEndpoints

log = logging.getLogger("vnetd.daemon")


def prepare(
    settings: Settings, env: Mapping[str, str], assigned_rank: int | None = None
) -> tuple[Effective, Member, DeviceConfig]:
    """Resolve identity and device config; every failure is a ``VnetdError``.

    Args:
        assigned_rank: the rank the registry assigned (``--rank auto``); None:
            ``--rank``, the environment or the hostname.
    """
    spec = settings.spec
    if assigned_rank is None:
        rank = resolve_rank(spec, settings.rank, env, socket.gethostname())
    else:
        rank = assigned_rank
    set_rank(rank)
    keys = load_or_create_key(settings.state_dir)
    needs_route = not settings.endpoint and not env.get("POD_IP")
    endpoint = resolve_endpoint(
        spec, settings.endpoint, env, default_route_address() if needs_route else None
    )
    resolved = effective(settings, env)
    spec = resolved.spec
    me = Member(
        rank=rank,
        public_key=keys.public_key,
        endpoint=endpoint,
        instance=resolve_instance(settings.instance, env),
        started=time.time(),
        version=__version__,
        site=resolved.site,
        public_endpoint=resolved.public_endpoint,
    )
    config = DeviceConfig(
        interface=spec.interface,
        private_key=keys.private_key,
        listen_port=_port_of(endpoint, spec.port),
        address=spec.interface_address(rank),
        network=spec.network,
        mtu=resolve_mtu(spec, endpoint),
        persistent_keepalive=spec.persistent_keepalive,
        preshared_key=resolved.preshared_key,
        address6=spec.interface_address6(rank),
        network6=spec.network6,
    )
    return resolved, me, config


def _port_of(endpoint: str, default: int) -> int:
    port = endpoint.rpartition(":")[2]
    return int(port) if port.isdigit() else default


async def run_daemon(
    settings: Settings,
    env: Mapping[str, str],
    *,
    open_dataplane: DataplaneFactory | None = None,
    open_registry: RegistryOpener = open_settings_registry,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled. Signals are the caller's: see ``run_until_signal``.

    Raises:
        VnetdError: bad input, a spec that differs from the registry's, or a
            data plane that cannot be set up.
    """
    assigned = None  # --rank auto: the registry's rank, handed on as it is
    if wants_auto_rank(settings.rank, env):
        assigned = await _auto_rank(settings, env, open_registry)
    resolved, me, config = await trio.to_thread.run_sync(prepare, settings, env, assigned)
    spec = resolved.spec
    log.info(
        "starting: rank %d address %s on %s, endpoint %s, instance %s, registry %s",
        me.rank,
        config.describe_addresses(),
        config.interface,
        me.endpoint,
        me.instance,
        ",".join(spec.registry.endpoints),
    )
    if me.site != DEFAULT_SITE or me.public_endpoint:
        log.info("site %s, public endpoint %s", me.site, me.public_endpoint or "none")
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
                started = Started(task_status, endpoints)
                on_pass = endpoints.daemon_metrics.observe_pass if endpoints else None
                async with open_registry(spec.registry) as registry:
                    await run_control_plane(resolved, me, registry, dataplane, on_pass, started)
            nursery.cancel_scope.cancel()


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


def wants_auto_rank(flag: str | None, env: Mapping[str, str]) -> bool:
    """``--rank auto`` (or ``VNETD_RANK=auto`` without a flag): the registry assigns it."""
    value = flag if flag is not None else env.get("VNETD_RANK")
    return value is not None and value.strip().lower() == "auto"


async def _auto_rank(
    settings: Settings, env: Mapping[str, str], open_registry: RegistryOpener
) -> int:
    """This node's sticky rank from the registry, waiting for etcd as long as it takes."""
    from vnetd.control.assign import assign_rank

    spec = settings.spec
    node = resolve_instance(settings.instance, env)
    with plain_errors():
        async with open_registry(spec.registry) as registry:
            return await retry_registry(
                "rank assignment", lambda: assign_rank(registry, spec, node), RegistryHealth()
            )


async def run_until_signal(settings: Settings, env: Mapping[str, str]) -> None:
    """The process's entry point: run the daemon until SIGTERM or SIGINT.

    Signal handlers are process-wide, so they are installed here, once, and
    not by ``run_daemon``, which tests run several times in one process.
    """
    with plain_errors(), trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as root:
            root.start_soon(_cancel_on_signal, signals, root.cancel_scope)
            await run_daemon(settings, env)
            root.cancel_scope.cancel()
    log.info("stopped")


async def _cancel_on_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
    async for signum in signals:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        scope.cancel()
        return
