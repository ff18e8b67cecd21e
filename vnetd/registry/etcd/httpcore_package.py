"""httpcore, imported without its asyncio and HTTP/2 halves, which a trio daemon never runs.

httpx's first ``AsyncClient`` imports httpcore, and httpcore imports ``anyio``
(its primitives under asyncio) and ``h2`` (HTTP/2) whenever they are installed;
both are (anyio is httpx's dependency, h2 hypercorn's). On the way to the claim
that was about 20 ms of CPU of httpcore's 30-40 (measured with httpcore 1.0.9,
anyio 4.16, h2 4.4; docs/architecture.md, "Start-up"). httpcore is written for
either being absent: under trio it takes trio's locks and events, and without h2
an HTTP/2 connection raises, which ``EtcdRegistry`` (HTTP/1.1) never opens. So
``import_httpcore`` imports it with both marked absent (``None`` in
``sys.modules``, Python's own way to make an import fail) and then removes the
marks: a later ``import h2`` (hypercorn, for ``[http] listen``) or ``import
anyio`` imports them as usual. A module already imported is left as it is.
"""

from __future__ import annotations

import sys

SKIPPED = ("anyio", "h2")


def import_httpcore() -> None:
    """Import httpcore, without ``SKIPPED`` unless they are imported already."""
    if "httpcore" in sys.modules:
        return
    marked = [name for name in SKIPPED if name not in sys.modules]
    for name in marked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import httpcore  # noqa: F401 (imported for httpx, which imports it again)
    finally:
        for name in marked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
