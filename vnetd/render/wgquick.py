"""A wg-quick config that lets a machine outside the cluster hold one rank.

The peers come from ``mesh.desired_peers``, the function the daemon itself
uses, so the config holds exactly the peers a daemon of that rank would
configure (a public key under two ranks is kept for the lowest only). It is
a snapshot of the members passed in: the cluster's daemons add this machine
only while its rank is registered with its public key.

The private key appears in the ``PrivateKey`` line and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping

from vnetd.mesh.peers import desired_peers
from vnetd.model import KeyPair, Member
from vnetd.spec import MeshSpec


def placeholder_key(rank: int) -> str:
    """The ``PrivateKey`` value written when no key file is given."""
    return f"<private key of rank {rank}: put it here>"


def registration_problem(
    rank: int, members: Mapping[int, Member], public_key: str | None
) -> str | None:
    """Why the cluster would not accept this machine as ``rank``, or None.

    Args:
        public_key: the key file's public key; None when there is no key
            file, in which case only a missing registration is a problem.
    """
    member = members.get(rank)
    if member is None:
        return (
            f"rank {rank} is not registered: the cluster's daemons will not add "
            "this machine as a peer until it is"
        )
    if public_key is not None and member.public_key != public_key:
        return (
            f"rank {rank} is registered with public key {member.public_key}, not this "
            f"key's {public_key}: the cluster's daemons will not accept this machine"
        )
    return None


def render_wg_quick(
    spec: MeshSpec, rank: int, members: Mapping[int, Member], key: KeyPair | None
) -> str:
    """The wg-quick config of ``rank`` with one ``[Peer]`` per other registered rank.

    Args:
        members: the registered members by rank (``membership.read_members``).
        key: the rank's key pair; None writes a placeholder ``PrivateKey``.

    Raises:
        SpecError: ``rank`` is out of range.
    """
    spec.check_rank(rank)
    public_key = key.public_key if key else None
    peers, skipped = desired_peers(members, rank, spec, public_key or "")
    lines = _header(spec, rank, members, public_key)
    lines.extend(f"# rank {s.rank} left out: {s.reason}" for s in skipped)
    lines += [
        "",
        "[Interface]",
        f"PrivateKey = {key.private_key if key else placeholder_key(rank)}",
        f"Address = {', '.join(str(addr) for addr in spec.interface_addresses(rank))}",
        f"ListenPort = {spec.port}",
    ]
    # mtu = "auto": no MTU line, and wg-quick derives it from the endpoint route's MTU.
    if isinstance(spec.mtu, int):
        lines.append(f"MTU = {spec.mtu}")
    for peer_rank in sorted(members):
        peer = peers.get(members[peer_rank].public_key)
        if peer is None or peer.rank != peer_rank:
            continue
        lines += [
            "",
            f"# rank {peer_rank} {spec.host(peer_rank)}",
            "[Peer]",
            f"PublicKey = {peer.public_key}",
            f"AllowedIPs = {', '.join(peer.allowed_ips)}",
        ]
        if peer.endpoint:
            lines.append(f"Endpoint = {peer.endpoint}")
        keepalive = spec.persistent_keepalive if peer.keepalive is None else peer.keepalive
        if keepalive > 0:
            lines.append(f"PersistentKeepalive = {keepalive}")
    return "\n".join(lines) + "\n"


def _header(
    spec: MeshSpec, rank: int, members: Mapping[int, Member], public_key: str | None
) -> list[str]:
    lines = [
        f"# wg-quick config rendered by vnetd for rank {rank} ({spec.host(rank)}) "
        f"of mesh {spec.name}.",
        "# A snapshot of the peers registered now: render it again when ranks join or leave.",
        f"# The cluster's daemons add this machine as a peer only while rank {rank} is",
        "# registered in the registry with this config's public key.",
    ]
    if public_key is not None:
        lines.append(f"# This config's public key: {public_key}")
    elif rank in members:
        lines.append(
            f"# Rank {rank} is registered with public key {members[rank].public_key}: "
            "PrivateKey must be its private key."
        )
    problem = registration_problem(rank, members, public_key)
    if problem:
        lines.append(f"# WARNING: {problem}.")
    return lines
