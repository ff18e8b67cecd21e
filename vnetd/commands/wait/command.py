"""``vnetd wait``: exit 0 once the named ranks are registered (and reachable), 1 on timeout.

The gate a launcher runs before a job that needs N ranks::

    vnetd wait --config mesh.toml --ranks all --timeout 300
    vnetd wait --config mesh.toml --min-peers 7 --reachable

Exit status: 0 ready, 1 timed out, 2 bad input (the CLI prints the error).
Progress goes to stderr at the start and every 5 s; the success line to stdout.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vnetd.config import (
    DEFAULT_WIREGUARD_DIR,
    add_etcd_arguments,
    add_wireguard_dir_argument,
    settings_from_args,
)
from vnetd.dataplane.codec.uapi_protocol import socket_path
from vnetd.errors import IdentityError, SpecError, plain_errors
from vnetd.model import DevicePeer
from vnetd.ranks import parse_ranks
from vnetd.registry import RegistryOpener
from vnetd.spec import MeshSpec
from vnetd.wait.gate import Gate, ready_line, timeout_line

if TYPE_CHECKING:  # the waiting itself imports trio: only when the command runs
    from vnetd.commands.wait.run import PeerReader

DEFAULT_TIMEOUT = 300.0
UAPI_TIMEOUT = 2.0
EXIT_READY = 0
EXIT_TIMED_OUT = 1


@dataclass(frozen=True)
class WaitOptions:
    """``vnetd wait``'s settings: the resolved spec and the command's flags, as given."""

    spec: MeshSpec
    ranks: str | None = None
    min_peers: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    reachable: bool = False
    rank: str | None = None
    wireguard_dir: Path = DEFAULT_WIREGUARD_DIR


@dataclass(frozen=True)
class WaitPlan:
    """Validated options: what to wait for, where, and how long."""

    spec: MeshSpec
    gate: Gate
    timeout: float
    device_socket: Path | None
    """wireguard-go's UAPI socket of this rank's device (with ``--reachable``)."""


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "wait",
        help="wait until ranks are registered (and reachable), for gating a job",
        description=(
            "Exit 0 once the ranks are registered in the registry (with --reachable: and "
            "have completed a WireGuard handshake with this rank); exit 1 on timeout."
        ),
        epilog="exit status: 0 ready, 1 timed out, 2 bad input",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--ranks", metavar="SPEC", help="ranks that must be registered: all, 5, 0-7, 0,3,5-9"
    )
    which.add_argument(
        "--min-peers",
        type=int,
        metavar="K",
        help="at least K ranks other than this one must be registered (0..size-1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"give up and exit 1 after this long (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--reachable",
        action="store_true",
        help=(
            "also require a WireGuard handshake between this rank and each counted rank "
            "(with its site gateway for a rank reached through one)"
        ),
    )
    parser.add_argument(
        "--rank", help="this host's rank (else VNETD_RANK, JOB_COMPLETION_INDEX, hostname)"
    )
    add_etcd_arguments(parser)
    add_wireguard_dir_argument(parser, f" (default {DEFAULT_WIREGUARD_DIR}; for --reachable)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The CLI entry point: validate, then wait; returns the exit status."""
    import trio

    opts = settings_from_args(WaitOptions, args, os.environ)
    plan = plan_wait(opts, os.environ, socket.gethostname())
    return trio.run(run_wait, plan)


def plan_wait(opts: WaitOptions, env: Mapping[str, str], hostname: str) -> WaitPlan:
    """Check every option against the (resolved) spec.

    Raises:
        VnetdError: naming the option and the fix (the CLI exits 2).
    """
    if not math.isfinite(opts.timeout) or opts.timeout <= 0:
        raise SpecError(f"--timeout: {opts.timeout:g} is not a positive number of seconds")
    if (opts.ranks is None) == (opts.min_peers is None):
        raise SpecError("give exactly one of --ranks SPEC and --min-peers K")
    spec = opts.spec
    self_rank = _self_rank(spec, opts, env, hostname)
    if opts.min_peers is not None:
        if not 0 <= opts.min_peers <= spec.size - 1:
            raise SpecError(
                f"--min-peers: {opts.min_peers} is out of range; mesh {spec.name!r} has "
                f"{spec.size} ranks, so give 0..{spec.size - 1}"
            )
        gate = Gate(spec.size, (), opts.min_peers, self_rank, opts.reachable)
    else:
        assert opts.ranks is not None
        gate = Gate(spec.size, parse_ranks(opts.ranks, spec.size), None, self_rank, opts.reachable)
    device_socket = (
        Path(socket_path(spec.interface, opts.wireguard_dir)) if opts.reachable else None
    )
    return WaitPlan(spec, gate, opts.timeout, device_socket)


def _self_rank(
    spec: MeshSpec, opts: WaitOptions, env: Mapping[str, str], hostname: str
) -> int | None:
    """This host's rank as the daemon resolves it.

    With ``--reachable`` it is required. Otherwise only a host that gives no
    rank at all is accepted (as None); a rank that is given but bad is an error.
    """
    from vnetd.identity import rank_given, resolve_rank  # cryptography: not for the parser

    try:
        return resolve_rank(spec, opts.rank, env, hostname)
    except IdentityError:
        if opts.reachable or rank_given(opts.rank, env):
            raise
        return None


async def run_wait(
    plan: WaitPlan,
    *,
    open_registry: RegistryOpener | None = None,
    read_peers: PeerReader | None = None,
) -> int:
    """Wait as ``plan`` says, print the outcome, return the exit status.

    Args:
        open_registry: the registry for a spec (default: etcd at its endpoints).
        read_peers: the device reader (default: wireguard-go's UAPI socket
            at ``plan.device_socket``, else the kernel's device of that
            interface); only used with ``--reachable``.

    Raises:
        VnetdError: the registry refused a request.
    """
    from vnetd.commands.wait.run import wait_for_gate
    from vnetd.registry import open_registry as open_settings_registry

    opener = open_registry or open_settings_registry
    if plan.gate.reachable and read_peers is None:
        assert plan.device_socket is not None
        read_peers = uapi_peers(plan.device_socket, plan.spec.size - 1)
    with plain_errors():
        async with opener(plan.spec.registry) as registry:
            outcome = await wait_for_gate(
                plan.gate,
                plan.spec,
                registry,
                timeout=plan.timeout,
                report=_to_stderr,
                read_peers=read_peers,
            )
    if outcome.ready:
        print(ready_line(outcome.summary, outcome.elapsed), flush=True)
        return EXIT_READY
    _to_stderr(timeout_line(outcome.summary, outcome.notes, plan.timeout))
    return EXIT_TIMED_OUT


def uapi_peers(path: Path, max_peers: int = 0) -> PeerReader:
    """Read the peers of the local device (their allowed IPs and handshakes):
    wireguard-go's UAPI socket at ``path``, else the kernel's WireGuard device
    (``read_device``; its bound grows with ``max_peers``, the most peers it may hold)."""
    from vnetd.dataplane.device_reader import read_local_device

    async def read() -> Mapping[str, DevicePeer]:
        device = await read_local_device(path, UAPI_TIMEOUT, max_peers)
        return device.peers

    return read


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
