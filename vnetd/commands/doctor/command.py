"""``vnetd doctor``: every ordered pair of the mesh probed, and one cause for each that fails.

    vnetd doctor --config mesh.toml
    vnetd doctor --config mesh.toml --json --timeout 60

Run it inside any pod of the mesh: it reads the registry once and asks each
daemon's probe service over the overlay for its row (docs/architecture.md,
"Doctor"). The parser; the settings are ``vnetd.commands.doctor.plan``'s ``DoctorPlan``
and the run is ``vnetd.commands.doctor.gather``.
Exit status: 0 every pair reaches the other, 1 some pair fails or was not judged
(an overloaded daemon), 2 bad input or the registry could not be read.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from vnetd.commands.doctor.plan import DEFAULT_TIMEOUT, DoctorPlan
from vnetd.config import add_etcd_arguments, settings_from_args


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "doctor",
        help="probe every pair of the mesh and name why each failing one fails",
        description=(
            "Reads the registry once and asks every daemon's probe service, over the "
            "overlay, to echo to the others and report what its device sees; prints the "
            "reach matrix and one cause per failing ordered pair. Run it inside a pod "
            "of the mesh."
        ),
        epilog="exit status: 0 all pairs good, 1 some pair fails or was not judged "
        "(overloaded), 2 bad input",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    add_etcd_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"bound on the whole run (default {DEFAULT_TIMEOUT:g})",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The CLI entry point; returns the exit status."""
    import trio

    from vnetd.commands.doctor.gather import doctor

    plan = settings_from_args(DoctorPlan, args, os.environ)
    return trio.run(doctor, plan)
