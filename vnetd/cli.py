"""The ``vnetd`` command line: up, plan, render, hosts, status, wait, demo.

Errors a user can cause print one line (``vnetd: error: ...``) and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from vnetd import __version__
from vnetd.errors import VnetdError
from vnetd.logs import LOG_FORMATS, setup_logging
from vnetd.registry.access import add_etcd_arguments, etcd_access


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vnetd",
        description="Rank-addressed WireGuard overlay: fixed addresses, any start order.",
    )
    parser.add_argument("--version", action="version", version=f"vnetd {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text (default) or json: one JSON object per line, for log collectors",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    up.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/var/lib/vnetd"),
        help="where the private key is kept (default /var/lib/vnetd)",
    )
    up.add_argument(
        "--preshared-key-file",
        metavar="FILE",
        help="a mesh-wide WireGuard pre-shared key (wg genpsk), mode 0600, e.g. a mounted "
        "Secret (else VNETD_PRESHARED_KEY_FILE, else [wireguard] preshared_key_file)",
    )
    up.add_argument(
        "--instance", help="the name that owns the claim (else POD_NAME, else hostname)"
    )
    up.add_argument(
        "--dataplane",
        default=None,
        choices=["auto", "kernel", "userspace", "fake"],
        help="auto: the kernel's WireGuard when a link can be created, else wireguard-go; "
        "kernel; userspace = wireguard-go; fake = in memory, for scale tests "
        "(default: the spec's [wireguard] dataplane, else auto)",
    )
    up.add_argument(
        "--resync-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="full reconcile with no event at least this often (default 30)",
    )

    up.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="serve /healthz /readyz /metrics /status here (overrides [http] listen)",
    )

    plan = sub.add_parser("plan", help="print the address plan of a spec")
    plan.add_argument("--config", required=True, type=Path)

    from vnetd.render import command as render_command
    from vnetd.status import command as status_command
    from vnetd.wait import command as wait_command

    render_command.add_parsers(sub)
    status_command.add_parser(sub)
    wait_command.add_parser(sub)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        if args.command == "up":
            return _up(args)
        if args.command == "plan":
            return _plan(args)
        if args.command in ("render", "hosts", "status", "wait"):
            result: int = args.run(args)
            return result
        if args.command == "demo":
            from vnetd.demo import run_demo

            return trio.run(run_demo, args.ranks, args.max_gap, args.seed, args.timeout)
    except VnetdError as exc:
        print(f"vnetd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _up(args: argparse.Namespace) -> int:
    from vnetd.daemon import UpOptions, run_until_signal

    opts = UpOptions(
        config=args.config,
        rank=args.rank,
        etcd=args.etcd,
        endpoint=args.endpoint,
        state_dir=args.state_dir,
        preshared_key_file=args.preshared_key_file,
        instance=args.instance,
        dataplane=args.dataplane,
        resync_interval=args.resync_interval,
        http_listen=args.http_listen,
        etcd_access=etcd_access(args),
    )
    trio.run(run_until_signal, opts, dict(os.environ))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from vnetd.spec import load_spec

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


if __name__ == "__main__":
    sys.exit(main())
