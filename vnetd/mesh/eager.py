"""Handshakes follow the traffic: which pairs handshake at once, and where a lazy pair rings.

Pure. With ``mesh.tree_fanout`` = K a pair is *eager* (its initiator starts a
handshake when it adds the peer, as every pair did before) when the two are
neighbours in the jobs' K-ary tree (Flux's ``tbon.fanout`` numbering: rank
r > 0 has parent (r - 1) // K), when either is a site gateway, or when the
pair needs keepalives (the spec's ``persistent_keepalive``, or two sites:
NAT mappings); ``PairRule.lazy`` also keeps a plain WireGuard host (no
``device_id``, no doorbell) eager. Every other pair is *lazy*: both sides hold the peer (key,
route, an endpoint) from the moment they know it, and the first packet
starts the handshake. The rule is symmetric, so both sides agree. How a
lazy pair's first packet avoids WireGuard's 5 s retry (the doorbell), and the
figures that decided it, are in docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

from ipaddress import ip_address

from vnetd.spec import MeshSpec


def tree_neighbours(rank: int, size: int, fanout: int) -> frozenset[int]:
    """``rank``'s parent and children in the K-ary tree of ``size`` ranks (none when K < 1)."""
    if fanout < 1:
        return frozenset()
    first = rank * fanout + 1
    children = range(first, min(first + fanout, size))
    return frozenset((*children, *(((rank - 1) // fanout,) if rank > 0 else ())))


def gateway_ranks(spec: MeshSpec) -> frozenset[int]:
    """Every rank the spec names as a site gateway."""
    return frozenset(rank for _, ranks in spec.gateways for rank in ranks)


def eager_ranks(self_rank: int, spec: MeshSpec) -> frozenset[int]:
    """The ranks ``self_rank`` handshakes with at once whatever their site: its tree
    neighbours and the gateways (all of them, when it is a gateway itself); with
    ``tree_fanout`` 0, every other rank."""
    if not spec.tree_fanout:
        return frozenset(range(spec.size)) - {self_rank}
    gateways = gateway_ranks(spec)
    if self_rank in gateways:
        return frozenset(range(spec.size)) - {self_rank}
    return (tree_neighbours(self_rank, spec.size, spec.tree_fanout) | gateways) - {self_rank}


def eager_pair(spec: MeshSpec, self_rank: int, peer_rank: int, *, same_site: bool) -> bool:
    """The pair starts its handshakes at once (see the module docstring); symmetric,
    and O(gateways): a full pass asks it for every peer."""
    if not spec.tree_fanout or spec.persistent_keepalive or not same_site:
        return True
    if any(rank in (self_rank, peer_rank) for _, ranks in spec.gateways for rank in ranks):
        return True
    fanout = spec.tree_fanout
    return (self_rank > 0 and (self_rank - 1) // fanout == peer_rank) or (
        peer_rank > 0 and (peer_rank - 1) // fanout == self_rank
    )


def doorbell_endpoint(endpoint: str, port: int) -> str:
    """``endpoint`` (``host:port``, IPv6 in brackets) with its port replaced: where the
    peer's doorbell listens, beside its WireGuard port."""
    host = endpoint.rsplit(":", 1)[0]
    return f"{host}:{port}"


def endpoint_of(host: str, port: int) -> str:
    """A UDP source address as an endpoint string (an IPv4-mapped IPv6 host unmapped)."""
    address = ip_address(host.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
