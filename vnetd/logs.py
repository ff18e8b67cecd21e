"""Log setup: one line per event, each carrying the daemon's rank."""

from __future__ import annotations

import logging
import sys

_rank: str = "-"


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _rank
        return True


def set_rank(rank: int) -> None:
    global _rank
    _rank = str(rank)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d vnetd rank=%(rank)s %(levelname)s %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "pyroute2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
