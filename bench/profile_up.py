#!/usr/bin/env python3
"""``vnetd`` under cProfile from the interpreter's first import to the claim.

    profile_up.py DIR <vnetd's arguments>

Runs ``vnetd.cli.main`` with the arguments after ``DIR`` and writes
``DIR/up-<pid>.prof`` once the daemon logs its claim (the profile of what a
launcher's wait and the claim cost: imports included, since the profiler is on
before vnetd is imported); the daemon then runs on unprofiled. Used by
``bench/startup.py --profile DIR``; read the file with ``python -m pstats``.
"""

from __future__ import annotations

import cProfile
import logging
import os
import sys
from pathlib import Path

profiler = cProfile.Profile()
profiler.enable()

from vnetd.cli import main  # noqa: E402 (profiled)


class AtClaim(logging.Handler):
    """Stops the profiler and writes its file at the ``claimed rank`` line."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if self.path.exists() or not record.getMessage().startswith("claimed rank"):
            return
        profiler.disable()
        profiler.dump_stats(self.path)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    logging.getLogger("vnetd.claim").addHandler(AtClaim(out / f"up-{os.getpid()}.prof"))
    sys.exit(main(sys.argv[2:]))
