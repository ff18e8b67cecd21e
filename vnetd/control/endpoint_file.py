"""The public endpoint file, followed while the daemon runs (``--public-endpoint-file``).

What the NAT in front of a member forwards can change while it runs (another port,
another address); a sidecar or an operator writes the new endpoint into a file and
the claim registers it (``ClaimHolder.set_public_endpoint``), so peers of other
sites write it to their devices (invariant 4: the registry's endpoint for the rank
changed). See docs/architecture.md, "Sites".
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from vnetd.control.claim import ClaimHolder
from vnetd.model import check_endpoint

log = logging.getLogger("vnetd.claim")

PUBLIC_ENDPOINT_POLL = 1.0
"""How often ``follow_public_endpoint`` reads its file (a stat and a short read)."""


async def follow_public_endpoint(path: Path, claim: ClaimHolder) -> None:
    """Register the endpoint written in ``path`` whenever it changes (docs/architecture.md,
    "Sites"). An unreadable file or a bad value is logged once and the registered
    endpoint kept; an empty file means none."""
    complaint = ""
    while True:
        await trio.sleep(PUBLIC_ENDPOINT_POLL)
        try:
            text = (await trio.Path(path).read_text()).strip()
            endpoint = check_endpoint(text) if text else None
        except (OSError, ValueError) as exc:
            problem = exc.strerror if isinstance(exc, OSError) else str(exc)
            if problem != complaint:
                log.warning("public endpoint file %s: %s; keeping %s", path, problem,
                            claim.me.public_endpoint or "none")  # fmt: skip
                complaint = problem or ""
            continue
        complaint = ""
        claim.set_public_endpoint(endpoint)
