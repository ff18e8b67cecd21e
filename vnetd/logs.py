"""Log setup: one line per event, each carrying the daemon's rank.

``text`` (the default) is for people; ``json`` is one JSON object per line
for log collectors, written by python-json-logger with the fields ``time``
(UTC, ISO 8601), ``level``, ``logger``, ``rank`` and ``message``.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMATS = ("text", "json")
_rank: str = "-"


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _rank
        return True


def set_rank(rank: int) -> None:
    global _rank
    _rank = str(rank)


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter  # only for json logs

        return JsonFormatter(
            "%(levelname)s %(name)s %(rank)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
            json_ensure_ascii=False,
        )
    if log_format == "text":
        return logging.Formatter(
            "%(asctime)s.%(msecs)03d vnetd rank=%(rank)s %(levelname)s %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
    raise ValueError(f"log format {log_format!r} is not one of {LOG_FORMATS}")


def setup_logging(level: str = "INFO", log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(_formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "pyroute2", "hypercorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
