"""``vnetd plan``: print the address plan of a spec, one line per rank.

The spec alone decides it (no flag, no environment, no registry), so the
command loads the spec file and imports nothing else.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vnetd.spec import load_spec


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    plan = sub.add_parser("plan", help="print the address plan of a spec")
    plan.add_argument("--config", required=True, type=Path)
    plan.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    networks = " and ".join(str(net) for net in spec.networks)
    print(f"# mesh {spec.name}: {spec.size} ranks in {networks}, port {spec.port}")
    if spec.network6 is not None:
        print("# rank, address, hostname, IPv6 address")
    for rank in range(spec.size):
        # Dual stack: the IPv6 address is a 4th column, so the first three stay as they were.
        extra = "".join(f"\t{addr}" for addr in spec.addresses(rank)[1:])
        print(f"{rank}\t{spec.address(rank)}\t{spec.host(rank)}{extra}")
    return 0
