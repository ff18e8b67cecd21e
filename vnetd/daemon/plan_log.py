"""The reconciler's lines about a plan: one per peer joined, left or moved, and one per plan;
and about a handshake check (``log_checked``).

A rank that joins and leaves again and again (a crash-looping pod, or a registry
writer flapping an entry) would cost one line per change on every daemon, as many
as etcd takes writes. ``FlapLimit`` names ``FLAP_NAMED`` changes of one rank per
``FLAP_WINDOW``, counts the rest, and says how many it did not name once the rank
has been steady for ``STEADY`` s. A formation (each rank joins once) logs as before.
Written here rather than with ``control.log_limit.LogLimit``: that one counts per
kind of line, this per rank, and its count is told when the rank settles, not at
the next line of its kind.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vnetd.mesh.initiator import FALLBACK_AFTER, RETRIES, Checked
from vnetd.mesh.peers import device_restarted
from vnetd.model import Peer, Plan
from vnetd.ranks import format_ranks

log = logging.getLogger("vnetd.reconcile")

FLAP_NAMED = 6
"""Passes that change one rank's peer named per ``FLAP_WINDOW`` (three joins, three leaves)."""
FLAP_WINDOW = 60.0
STEADY = 5.0
"""A counted rank's summary is logged once it has not changed for this long."""
NAMED_PER_PASS = 8
"""Peers a handshake check names one line each; more get one line with their ranks (a
1023-peer device whose peers had not answered logged 1022 lines in one pass)."""


@dataclass(slots=True)
class _Window:
    start: float
    named: int = 0
    unnamed: int = 0
    last: float = 0.0


class FlapLimit:
    """Which changes of which rank are named; times are ``trio.current_time()``.

    Memory: one small record per rank changed in the last ``FLAP_WINDOW``.
    """

    def __init__(self) -> None:
        self._windows: dict[int, _Window] = {}
        """In the order their windows started (a new window moves a rank to the end)."""
        self._counting: dict[int, _Window] = {}

    def named(self, rank: int, now: float) -> bool:
        """Note a pass that changes ``rank``'s peer; True: name its lines."""
        self._expire(now)
        window = self._windows.get(rank)
        if window is None:
            window = self._windows[rank] = _Window(now)
        window.last = now
        if window.named < FLAP_NAMED:
            window.named += 1
            return True
        if not window.unnamed:
            self._counting[rank] = window
            log.warning(
                "rank %d joined or left %d times in %.0f s: counting its joins and leaves, "
                "naming them again once it has been steady for %.0f s",
                rank, window.named, now - window.start, STEADY,
            )  # fmt: skip
        window.unnamed += 1
        return False

    def next_summary(self) -> float:
        """When the next counted rank will have been steady for ``STEADY`` s (or inf)."""
        return min((w.last + STEADY for w in self._counting.values()), default=math.inf)

    def flush(self, now: float) -> None:
        """Log the summary of every counted rank steady for ``STEADY`` s."""
        for rank, window in list(self._counting.items()):
            if now >= window.last + STEADY:
                self._summary(rank, window)
        self._expire(now)

    def _summary(self, rank: int, window: _Window) -> None:
        log.warning(
            "%d joins and leaves of rank %d not logged (over %.0f s); it has been steady "
            "for %.0f s",
            window.unnamed, rank, window.last - window.start, STEADY,
        )  # fmt: skip
        window.unnamed = 0
        del self._counting[rank]

    def _expire(self, now: float) -> None:
        """Forget the windows that ended (the oldest first) whose rank is not counted."""
        while self._windows:
            rank, window = next(iter(self._windows.items()))
            if now - window.start < FLAP_WINDOW or rank in self._counting:
                return
            del self._windows[rank]


def readded(plan: Plan) -> set[str]:
    """Keys removed and added in one plan: peers whose device restarted, or held peers
    that are ours to start now (see ``mesh.diff``)."""
    return {peer.public_key for peer in plan.remove} & {peer.public_key for peer in plan.add}


def log_plan(
    plan: Plan,
    ranks: Mapping[str, int],
    old_ranks: Mapping[str, int],
    written: Mapping[str, str | None],
    devices: Mapping[str, str],
    elapsed: float,
    quiet: set[int],
) -> None:
    """One line per peer of ``plan`` whose rank is not in ``quiet`` (being counted),
    then the plan's own line unless every rank it changed is quiet."""
    again = readded(plan)
    for peer in plan.add:
        if peer.rank in quiet:
            continue
        if peer.public_key not in again:
            log.info(
                "peer joined: rank %s at %s%s",
                peer.rank,
                peer.endpoint or "no endpoint",
                " (waiting for its handshake)" if peer.endpoint_held else "",
            )
            continue
        before = written.get(peer.public_key, peer.endpoint)
        if peer.endpoint is not None and before != peer.endpoint:
            log.info(
                "peer rank %s endpoint moved from %s to %s",
                peer.rank,
                before or "none",
                peer.endpoint,
            )
        if not device_restarted(peer, devices):
            log.info(
                "peer rank %s: ours to start now that this rank is registered; "
                "re-added it with a handshake",
                peer.rank,
            )
            continue
        log.info(
            "peer rank %s restarted its device (device id %s -> %s); re-added it "
            "to drop the old session",
            peer.rank,
            devices.get(peer.public_key) or "?",
            peer.device_id,
        )
    for peer in plan.remove:
        if peer.public_key not in again and old_ranks.get(peer.public_key) not in quiet:
            log.info("peer left: rank %s", old_ranks.get(peer.public_key, "?"))
    for upd in plan.update:
        rank = ranks.get(upd.public_key, "?")
        if rank in quiet:
            continue
        if upd.endpoint is not None:
            before_update = written.get(upd.public_key) or "none"
            log.info("peer rank %s endpoint moved from %s to %s", rank, before_update, upd.endpoint)
        if upd.allowed_ips is not None:
            log.info("peer rank %s allowed IPs set to %s", rank, ",".join(upd.allowed_ips))
    if not quiet or touched_ranks(plan, ranks, old_ranks) - quiet:
        log.info("plan applied: %d change(s) in %.1f ms", len(plan), elapsed * 1000)


def touched_ranks(
    plan: Plan, ranks: Mapping[str, int], old_ranks: Mapping[str, int]
) -> set[int | None]:
    """The ranks whose peer ``plan`` adds, removes or updates (None: a peer of no rank)."""
    return (
        {peer.rank for peer in plan.add}
        | {old_ranks.get(peer.public_key) for peer in plan.remove}
        | {ranks.get(upd.public_key) for upd in plan.update}
    )


def log_checked(found: Checked) -> None:
    """The lines of a handshake check (``HandshakeWatch.check``): a line per peer retried
    or fallen back, or one line for each kind when more than ``NAMED_PER_PASS``."""
    if len(found.retried) > NAMED_PER_PASS:
        log.info(
            "peer ranks %s (%d): no handshake after starting one; re-added them and started others",
            _ranks_of(peer for peer, _, _ in found.retried),
            len(found.retried),
        )
    else:
        for peer, attempt, waited in found.retried:
            log.info(
                "peer rank %s: no handshake %.1f s after starting one; re-added it and "
                "started another (try %d)",
                peer.rank,
                waited,
                attempt,
            )
    if len(found.fallbacks) > NAMED_PER_PASS:
        log.info(
            "peer ranks %s (%d): their handshakes did not come within %.1f s; wrote "
            "their endpoints, so this side starts one when it has something to send",
            _ranks_of(found.fallbacks),
            len(found.fallbacks),
            FALLBACK_AFTER,
        )
    else:
        for peer in found.fallbacks:
            log.info(
                "peer rank %s: its handshake did not come within %.1f s; wrote its "
                "endpoint, so this side starts one when it has something to send",
                peer.rank,
                FALLBACK_AFTER,
            )
    if found.answered:
        log.info(
            "peer rank%s %s: rang our doorbell (its first packet, no session); started "
            "the handshake",
            "s" if len(found.answered) > 1 else "",
            _ranks_of(found.answered),
        )
    if found.given_up:
        log.warning(
            "peer rank%s %s: still no handshake after %d tries; leaving %s to "
            "WireGuard's own retry",
            "s" if len(found.given_up) > 1 else "",
            _ranks_of(found.given_up),
            1 + RETRIES,
            "them" if len(found.given_up) > 1 else "it",
        )


def _ranks_of(peers: Iterable[Peer]) -> str:
    return format_ranks(peer.rank for peer in peers if peer.rank is not None)
