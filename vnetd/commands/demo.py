"""``vnetd demo``: build a lab of N pods on this machine and watch the mesh form.

The parser; what the demo does is ``vnetd.lab.demo_mesh``, imported when the
command runs (it needs root, etcd and wireguard-go).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    demo = sub.add_parser("demo", help="build a lab of N pods and watch the mesh form")
    demo.add_argument("--ranks", type=int, default=8, help="number of ranks (default 8)")
    demo.add_argument(
        "--max-gap",
        type=float,
        default=2.0,
        help="random gap between starts, 0..SECONDS (default 2)",
    )
    demo.add_argument("--seed", type=int, help="seed for the start order and gaps")
    demo.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="give up if the mesh is not full this long after the last start",
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 once the mesh is full and the lab is gone, 1 otherwise."""
    import trio

    from vnetd.lab.demo_mesh import run_demo

    return trio.run(run_demo, args.ranks, args.max_gap, args.seed, args.timeout)
