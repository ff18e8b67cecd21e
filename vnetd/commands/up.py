"""``vnetd up``: run the daemon for one rank until SIGTERM, SIGINT or ``--exit-on-file``.

The parser, and the resolution of the daemon's inputs before it starts: the
flags, the environment and the spec (``vnetd.config``), and the host's facts,
which this command reads itself, each only when it is needed, and hands to
``vnetd.daemon_settings`` as values. The daemon (``vnetd.daemon.root``) runs
from that record and reads no environment. It and the host probes (pyroute2)
are imported when the command runs, so building the CLI imports neither.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vnetd.config import (
    DEFAULT_RESYNC_INTERVAL,
    DEFAULT_STATE_DIR,
    Settings,
    add_etcd_arguments,
    add_exit_on_file_argument,
    add_public_endpoint_file_argument,
    add_site_arguments,
    settings_from_args,
)
from vnetd.daemon_settings import DaemonSettings, resolve_daemon_settings, resolve_exit_file
from vnetd.identity import needs_default_route, resolve_endpoint, resolve_rank_or_auto
from vnetd.logs import set_rank
from vnetd.spec import DATAPLANE_KINDS

log = logging.getLogger("vnetd.daemon")


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    up = sub.add_parser("up", help="run the daemon for one rank")
    up.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    up.add_argument(
        "--rank",
        help="this daemon's rank, or auto: a sticky rank per node from the registry "
        "(else VNETD_RANK, JOB_COMPLETION_INDEX, hostname)",
    )
    add_etcd_arguments(up)
    up.add_argument(
        "--endpoint",
        metavar="HOST:PORT",
        help="underlay endpoint peers send to (else POD_IP:port, else default-route address)",
    )
    add_site_arguments(up)
    add_public_endpoint_file_argument(up)
    up.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the private key is kept (default {DEFAULT_STATE_DIR})",
    )
    up.add_argument(
        "--preshared-key-file",
        metavar="FILE",
        help="a mesh-wide WireGuard pre-shared key (wg genpsk), mode 0600, e.g. a mounted "
        "Secret (else VNETD_PRESHARED_KEY_FILE, else [wireguard] preshared_key_file)",
    )
    up.add_argument(
        "--signing-key-file",
        metavar="FILE",
        help="the record signing key (vnetd signing-key --create --key-file FILE makes "
        "one), mode 0600 or 0400, e.g. a pinned gateway's from a mounted Secret (else "
        "VNETD_SIGNING_KEY_FILE, else [wireguard] signing_key_file, else signing.key in "
        "the state dir)",
    )
    up.add_argument(
        "--rank-cert-file",
        metavar="FILE",
        help="the rank certificate (DER or PEM) for the record signing key, where the "
        "spec pins [mesh] rank_ca: the csi-driver's tls.crt, or vnetd rank-cert's (else "
        "VNETD_RANK_CERT_FILE, else [wireguard] rank_cert_file)",
    )
    add_exit_on_file_argument(up)
    up.add_argument(
        "--instance", help="the name that owns the claim (else POD_NAME, else hostname)"
    )
    up.add_argument(
        "--dataplane",
        default=None,
        choices=DATAPLANE_KINDS,
        help="auto: the kernel's WireGuard when a link can be created, else wireguard-go; "
        "kernel; userspace = wireguard-go; fake = in memory, for scale tests "
        "(default: the spec's [wireguard] dataplane, else auto)",
    )
    up.add_argument(
        "--resync-interval",
        type=float,
        default=DEFAULT_RESYNC_INTERVAL,
        metavar="SECONDS",
        help="full reconcile with no event this often, or every N/8 s in a mesh of N "
        f"members over 8 x SECONDS (default {DEFAULT_RESYNC_INTERVAL:g})",
    )
    up.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="serve /healthz /readyz /metrics /status here (overrides [http] listen)",
    )
    up.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the settings, then run the daemon until a signal or the exit file; returns 0."""
    import trio

    from vnetd.daemon.root import run_until_signal

    flags = settings_from_args(Settings, args, os.environ)
    done = resolve_exit_file(flags.exit_on_file, os.environ)
    if done is not None and done.exists():  # a container restarted after its job ended
        log.info("%s exists: the job is done; not starting", done)
        return 0
    trio.run(run_until_signal, resolved_settings(flags, os.environ))
    return 0


def daemon_settings(args: argparse.Namespace, env: Mapping[str, str]) -> DaemonSettings:
    """The daemon's inputs resolved once: flags, ``env`` and spec, with the host's facts.

    The default route is read only when neither ``--endpoint`` nor ``POD_IP`` gives
    the endpoint, the underlay's MTU only for ``mesh.mtu = "auto"``.

    Raises:
        VnetdError: naming the flag, variable, spec key or host fact at fault.
    """
    return resolved_settings(settings_from_args(Settings, args, env), env)


def resolved_settings(flags: Settings, env: Mapping[str, str]) -> DaemonSettings:
    """``daemon_settings`` from the flags already resolved with the spec."""
    from vnetd.dataplane.rtnetlink.link_reads import default_route_address, resolve_mtu

    spec = flags.spec
    hostname = socket.gethostname()
    # The rank first, before the host is read: a bad rank is named before an endpoint or
    # MTU error, and the host probes' lines (``mtu auto: ...``) carry the rank.
    rank = resolve_rank_or_auto(spec, flags.rank, env, hostname)
    if isinstance(rank, int):
        set_rank(rank)
    route = default_route_address() if needs_default_route(flags.endpoint, env) else None
    endpoint = resolve_endpoint(spec, flags.endpoint, env, route)
    mtu = resolve_mtu(spec, endpoint)
    return resolve_daemon_settings(
        flags, env, hostname=hostname, rank=rank, endpoint=endpoint, mtu=mtu
    )
