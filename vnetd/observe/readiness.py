"""Readiness: the interface holds the rank's address and is up, and the rank is claimed.

It does not wait for peers (that is ``vnetd wait``): a native sidecar's
startup probe gates the main container on it, and the main container needs
only its own address to bind. Once claimed, a rank stays ready through a
registry outage: the address is still ours (static stability). A claim
found lost (the lease expired, another holder has the rank) is not ready
until the rank is claimed again.
"""

from __future__ import annotations

from ipaddress import ip_address

from vnetd.control.claim import ClaimState
from vnetd.dataplane.base import LinkState
from vnetd.observe.http import Check


def readiness(
    link: LinkState,
    interface: str,
    address: str,
    claim: ClaimState,
    rank: int = 0,
    holder: str | None = None,
    full: str | None = None,
) -> Check:
    """Whether a daemon with this link state and claim is ready, and why not; ``full``
    names a full registry (``status.view.registry_full_note``) that keeps a claim waiting."""
    if not link.exists:
        return Check(False, f"not ready: interface {interface} does not exist yet")
    if ip_address(address).compressed not in {ip_address(a).compressed for a in link.addresses}:
        return Check(False, f"not ready: {interface} does not hold {address} yet")
    if not link.up:
        return Check(False, f"not ready: {interface} is down")
    if claim == "displaced":
        return Check(
            False,
            f"not ready: displaced: rank {rank} was taken by {holder} while our lease lived; "
            "waiting for that entry to go",
        )
    if claim == "waiting":
        return Check(False, f"not ready: rank {rank} is held by {holder}; waiting for it to go")
    if claim != "claimed" and full is not None:
        return Check(False, f"not ready: rank {rank} is not claimed: {full}")
    if claim != "claimed":
        return Check(False, "not ready: the rank is not claimed yet (see the log for who holds it)")
    return Check(True, f"ready: {interface} holds {address}, rank claimed")
