"""The ``vnetd`` command line: composes the commands' parsers and runs the one chosen.

Each command registers its own parser with a ``run`` default (its
``add_parser``) and imports its heavy parts only when it runs, so ``vnetd
--help`` and ``vnetd plan`` import no trio, httpx or pyroute2. Errors a user
can cause print one line (``vnetd: error: ...``) and exit 2; Ctrl-C exits
130; a reader that closes the output early (``vnetd plan ... | head -3``)
ends the command quietly with 141, as a Unix tool killed by SIGPIPE does.

``vnetd up`` is what a launcher waits on, so its command line builds only the
``up`` parser (``command_of``): the other commands' modules (the renderers,
YAML) are not imported for it. Its usage, help and errors are the same, since
the top-level usage names the command ``COMMAND`` and a subparser's help is
its own.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from vnetd import __version__, gc_pause
from vnetd.commands import up
from vnetd.errors import VnetdError
from vnetd.logs import LOG_FORMATS, setup_logging

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def commands() -> tuple[ModuleType, ...]:
    """Every command's module, in the order ``vnetd --help`` lists them (render adds
    ``render`` and ``hosts``)."""
    from vnetd.commands import (
        address_plan,
        demo,
        provision,
        rank_cert,
        register,
        relay,
        signing_key,
    )
    from vnetd.commands.doctor import command as doctor_command
    from vnetd.commands.render import command as render_command
    from vnetd.commands.status import command as status_command
    from vnetd.commands.wait import command as wait_command

    return (
        up,
        register,
        address_plan,
        render_command,
        status_command,
        wait_command,
        provision,
        relay,
        signing_key,
        rank_cert,
        doctor_command,
        demo,
    )


VALUED_OPTIONS = ("--log-level", "--log-format")
"""The top-level options that take a value (``command_of`` steps over it)."""


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names when only ``VALUED_OPTIONS`` (spelled in full) come
    before it; None for anything else (help, version, an abbreviation), which the
    full parser handles."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        option, equals, _value = argv[i].partition("=")
        if option not in VALUED_OPTIONS:
            return None
        i += 1 if equals else 2
    return argv[i] if i < len(argv) else None


def build_parser(only: Sequence[ModuleType] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with every command or ``only`` these commands' modules."""
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
    for command in commands() if only is None else only:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    starts_daemon = command_of(given) == "up"
    if starts_daemon:
        gc_pause.pause()  # resumed once the daemon has claimed its rank (vnetd.gc_pause)
    else:
        gc_pause.resume(freeze=False)  # paused by ``python -m vnetd``: not for this command
    try:
        return _run(given, starts_daemon)
    finally:
        gc_pause.resume(freeze=False)  # a daemon resumed it once claimed (vnetd.gc_pause)


def _run(given: list[str], starts_daemon: bool) -> int:
    args = build_parser([up] if starts_daemon else None).parse_args(given)
    setup_logging(args.log_level, args.log_format)
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except VnetdError as exc:
        print(f"vnetd: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # Nothing more can be written: point stdout at /dev/null so the flush at exit
        # has nowhere to fail (the recipe of the Python docs' note on SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OUTPUT_CLOSED
    return status


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader is gone (poll reports an error),
    as opposed to a broken pipe elsewhere, such as a device's socket."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, 0)
    return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
