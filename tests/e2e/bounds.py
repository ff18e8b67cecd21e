"""The failure modes the e2e bounds sit below, and the formation bound the tests share.

The rule, and the figures measured for each bound: ``tests/README.md``. A
bound sits below the failure it guards and above the figure measured here
on a loaded 2-core machine; where no such window exists the test says so,
prints its figure, and the bench carries it.
"""

from __future__ import annotations

import time

import trio

from vnetd.lab.cluster import Formation, MeshLab

# --- failure modes (docs/architecture.md, docs/operations.md) --------------------------------

WG_RETRY = 5.0
"""WireGuard resends an unanswered handshake initiation after 5 s: what a peer that
is missing when the first handshake arrives costs (lost "peers before the claim")."""
WG_STALE_SESSION = 15.0
"""A peer that only sends on a session its peer lost waits ~15 s before a new handshake."""
WATCH_RESTART = 60.0
"""The watch's periodic restart: the only repair of a stream that silently stalled."""
REGISTRY_BACKOFF_MAX = 3.0
"""Registry calls are retried after 0.2 s doubling to 3 s (times 0.75-1, jitter)."""
WG_GO_BACKOFF = 0.5
"""A dead wireguard-go is started again at once; only a second death waits (0.5 s, 1, 2, 4)."""
INITIATOR_RETRY = 1.0
"""The initiator of a pair re-adds a peer whose first handshake has not completed after
about 1 s (invariant 10); near-simultaneous registrations cost a pair that one retry."""
RESPONDER_FALLBACK = 2.0
"""A responder whose initiator has not come writes the endpoint 2 s after registering."""


def earliest_lease_expiry(ttl: float) -> float:
    """The soonest a SIGKILLed daemon's lease can end after the kill: it was renewed
    at most TTL/3 before (keepalive every TTL/3), and lasts TTL from the renewal."""
    return ttl - ttl / 3


def latest_lease_drop(ttl: float) -> float:
    """The documented latest drop of a SIGKILLed member by its peers: TTL + 1 s."""
    return ttl + 1.0


# --- formation ---------------------------------------------------------------------------------

AFTER_CLAIM = 3.0
"""Every pair reached within this long after the last daemon's claim (and the probes'
start). Above one initiator retry (INITIATOR_RETRY) on loaded cores; below WG_RETRY,
so a handshake that waits for WireGuard's retry fails."""
FORMATION = 30.0
"""Every pair reached within this long after the first start: daemon start-up on
loaded cores included; below WATCH_RESTART, so a stalled watch fails."""
CLAIM_LOGGED = 4.5
"""Once every pair is reached, each rank's claim line is in its log within this long:
its peers add it as soon as its claim is in etcd, so on loaded cores a pair can be
reached before the claimant's loop logs the answer (seen under two xdist workers);
below the lab's 5 s lease TTL, which a daemon stalled that long would lose."""


async def form(
    mesh: MeshLab,
    ranks: set[int] | None = None,
    *,
    what: str = "formation",
    since: float | None = None,
) -> Formation:
    """Wait for the full mesh among ``ranks`` (probes running) and bound how it formed.

    Args:
        since: when the formation began (monotonic); the first start of ``ranks``
            by default. The full mesh is due within ``FORMATION`` of it.

    Raises:
        AssertionError: not full within ``FORMATION`` (with the missing pairs and
            the exited daemons), or the last pair came more than ``AFTER_CLAIM``
            after the last claim.
    """
    wanted = set(range(mesh.spec.size)) if ranks is None else ranks
    begun = min(mesh.started_at[r] for r in wanted) if since is None else since
    try:
        await mesh.wait_full_mesh(max(0.0, FORMATION - (time.monotonic() - begun)), ranks)
    except trio.TooSlowError as exc:
        tails = {r: mesh.daemons[r].log_text()[-1500:] for r in mesh.dead_daemons()}
        raise AssertionError(f"{what}: {exc}; logs of the exited daemons: {tails}") from exc
    with trio.move_on_after(CLAIM_LOGGED):
        while any(mesh.claimed_at(rank) is None for rank in wanted):
            await trio.sleep(0.05)
    formation = mesh.formation(ranks)
    print(f"{what}: {formation}")
    assert formation.after_claim <= AFTER_CLAIM, (
        f"{what}: the last pair came {formation.after_claim:.2f} s after the last claim "
        f"(bound {AFTER_CLAIM} s, a WireGuard retry is {WG_RETRY} s)"
    )
    return formation
