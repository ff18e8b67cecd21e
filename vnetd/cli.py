"""The ``vnetd`` command line: composes the commands' parsers and runs the one chosen.

Each command registers its own parser with a ``run`` default (its
``add_parser``) and imports its heavy parts only when it runs, so ``vnetd
--help`` and ``vnetd plan`` import no trio, httpx or pyroute2. Errors a user
can cause print one line (``vnetd: error: ...``) and exit 2; Ctrl-C exits
130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vnetd import __version__, demo, plan, up
from vnetd.errors import VnetdError
from vnetd.logs import LOG_FORMATS, setup_logging
from vnetd.render import command as render_command
from vnetd.status import command as status_command
from vnetd.wait import command as wait_command

COMMANDS = (up, plan, render_command, status_command, wait_command, demo)
"""In the order ``vnetd --help`` lists them (render adds ``render`` and ``hosts``)."""

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


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
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        status: int = args.run(args)
    except VnetdError as exc:
        print(f"vnetd: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status


if __name__ == "__main__":
    sys.exit(main())
