"""Site gateways: which peer carries the addresses of ranks not reached directly.

Pure. ``route_through_gateways`` takes the direct peers ``desired_peers``
computed and moves the host routes of every rank reached through a gateway
onto that gateway's peer; see docs/architecture.md, "Sites" (who holds which
addresses, the active gateway, invariants 1 and 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vnetd.model import Member, Peer
from vnetd.spec import MeshSpec


def active_gateways(spec: MeshSpec, present: set[int]) -> dict[str, int | None]:
    """Each gatewayed site's active gateway: its lowest-ranked present gateway, or None."""
    return {
        site: min((rank for rank in ranks if rank in present), default=None)
        for site, ranks in spec.gateways
    }


def route_through_gateways(
    peers: Mapping[str, Peer], members: Mapping[int, Member], self_rank: int, spec: MeshSpec
) -> dict[str, Peer]:
    """``peers`` with every rank reached through a gateway folded into that gateway's peer.

    A rank of another site is reached through the active gateway of our own
    site when we are a member (not a gateway) of a gatewayed site; else through
    the active gateway of its site when that site has gateways and it is not one
    of them; else directly. A rank whose gateway is absent is left out (no
    route: it fails fast, invariant 9). Each host route stays on exactly one
    peer (invariant 2), computed from its rank (invariant 1).
    """
    if not spec.gateways:
        return dict(peers)
    gateways = dict(spec.gateways)
    by_rank = {peer.rank: key for key, peer in peers.items() if peer.rank is not None}
    active = active_gateways(spec, {*by_rank, self_rank})
    my_site = spec.site.name
    behind_mine = my_site in gateways and self_rank not in gateways[my_site]
    routed: dict[str, Peer] = {}
    carried: dict[int, list[str]] = {}
    for key, peer in peers.items():
        member = members.get(peer.rank) if peer.rank is not None else None
        site = member.site if member is not None else my_site
        if site == my_site:
            routed[key] = peer
            continue
        if behind_mine:
            via = active.get(my_site)
        elif site in gateways and peer.rank not in gateways[site]:
            via = active.get(site)
        else:
            routed[key] = peer
            continue
        if via is not None and via in by_rank:
            carried.setdefault(via, []).extend(peer.allowed_ips)
    for rank, extra in carried.items():
        key = by_rank[rank]
        if key in routed:
            gateway = routed[key]
            routed[key] = replace(
                gateway, allowed_ips=tuple(sorted((*gateway.allowed_ips, *extra)))
            )
    return routed
