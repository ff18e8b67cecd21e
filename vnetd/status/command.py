"""``vnetd status``: every rank of the spec, registered or not, from any host that reaches etcd.

    vnetd status --config mesh.toml
    vnetd status --config mesh.toml --json
    vnetd status --config mesh.toml --watch --interval 5

The parser and the settings; what a view shows is ``vnetd.status.show``,
imported when the command runs. Exit status: 0 shown (whatever the number
of missing ranks), 2 bad input or the registry could not be read (one line
on stderr). ``--watch`` redraws until Ctrl-C, which exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vnetd.config import (
    DEFAULT_WIREGUARD_DIR,
    add_etcd_arguments,
    add_wireguard_dir_argument,
    settings_from_args,
)
from vnetd.dataplane.codec.uapi_protocol import socket_path
from vnetd.errors import SpecError
from vnetd.spec import MeshSpec

DEFAULT_INTERVAL = 2.0
MIN_INTERVAL = 0.2
MAX_INTERVAL = 3600.0


@dataclass(frozen=True)
class StatusPlan:
    """``vnetd status``'s settings: the resolved spec and the command's flags, checked.

    Raises:
        SpecError: ``--interval`` is out of range (the CLI exits 2).
    """

    spec: MeshSpec
    json: bool = False
    watch: bool = False
    interval: float = DEFAULT_INTERVAL
    wireguard_dir: Path = DEFAULT_WIREGUARD_DIR

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and MIN_INTERVAL <= self.interval <= MAX_INTERVAL):
            raise SpecError(
                f"--interval: {self.interval:g} is out of range; give {MIN_INTERVAL:g} to "
                f"{MAX_INTERVAL:g} seconds"
            )

    @property
    def device_socket(self) -> Path:
        """wireguard-go's UAPI socket, read when it is there."""
        return Path(socket_path(self.spec.interface, self.wireguard_dir))


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "status",
        help="show every rank of the mesh: registered or missing, endpoint, handshakes",
        description=(
            "One row per rank of the spec, registered or not, with the registry's endpoint "
            "and pod and, where this host sees the WireGuard device, the last handshake "
            "and traffic; a summary line names the missing ranks."
        ),
        epilog="exit status: 0 shown, 2 bad input or registry unreadable",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    add_etcd_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document instead of the table"
    )
    parser.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"with --watch: seconds between redraws (default {DEFAULT_INTERVAL:g})",
    )
    add_wireguard_dir_argument(
        parser,
        f" up (default {DEFAULT_WIREGUARD_DIR}); without it the kernel's WireGuard device is "
        "read, and with neither the device columns are omitted",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The CLI entry point; returns the exit status."""
    import trio

    from vnetd.status.show import show_status

    plan = settings_from_args(StatusPlan, args, os.environ)
    try:
        return trio.run(show_status, plan)
    except KeyboardInterrupt:
        if plan.watch:
            return 0
        raise
