"""Who this daemon is on this host: its rank, its endpoint and its instance name.

Rank order: ``--rank``, ``VNETD_RANK``, ``JOB_COMPLETION_INDEX`` (Kubernetes
Indexed Jobs), then the hostname parsed with the spec's pattern.
Endpoint order: ``--endpoint``, ``POD_IP`` with the spec's port, then the
address of the interface holding the default route. These are the settings
that need the host (its hostname, its default route); every other one is
resolved in ``vnetd.config``.
The key pair is ``vnetd.keys``'s.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from ipaddress import ip_address

from vnetd.errors import IdentityError
from vnetd.model import check_endpoint
from vnetd.spec import MeshSpec


def resolve_rank(spec: MeshSpec, flag: str | None, env: Mapping[str, str], hostname: str) -> int:
    """The rank from the first source that gives one.

    Raises:
        IdentityError: no source gives a rank, or it is not an integer in range.
    """
    sources = [
        ("--rank", flag),
        ("VNETD_RANK", env.get("VNETD_RANK")),
        ("JOB_COMPLETION_INDEX", env.get("JOB_COMPLETION_INDEX")),
    ]
    for name, value in sources:
        if value is None or value == "":
            continue
        value = value.strip()
        if not value.isdigit():
            raise IdentityError(f"{name}: {value!r} is not a rank (a non-negative integer)")
        rank = int(value)
        if rank >= spec.size:
            raise IdentityError(
                f"{name}: rank {rank} is out of range: mesh {spec.name!r} has ranks "
                f"0..{spec.size - 1}"
            )
        return rank
    from_host = spec.rank_of_host(hostname)
    if from_host is None:
        example = spec.host(0)
        raise IdentityError(
            "no rank: give --rank, or set VNETD_RANK or JOB_COMPLETION_INDEX, or run on a "
            f"host named like {example!r} (this host is {hostname!r})"
        )
    return from_host


def resolve_instance(flag: str | None, env: Mapping[str, str]) -> str:
    """The pod name that owns the claim: ``--instance``, ``POD_NAME``, else the hostname."""
    return flag or env.get("POD_NAME") or socket.gethostname()


def resolve_endpoint(
    spec: MeshSpec, flag: str | None, env: Mapping[str, str], default_route_ip: str | None
) -> str:
    """The underlay ``ip:port`` that peers should send to.

    Args:
        default_route_ip: the address of the default-route interface, looked
            up by the caller (``link.default_route_address``), or None.
    """
    if flag:
        try:
            return check_endpoint(flag)
        except ValueError as exc:
            raise IdentityError(f"--endpoint: {exc}") from None
    pod_ip = env.get("POD_IP")
    if pod_ip:
        return _join(pod_ip, spec.port, "POD_IP")
    if default_route_ip:
        return _join(default_route_ip, spec.port, "default route")
    raise IdentityError(
        "no endpoint: give --endpoint HOST:PORT or set POD_IP; this host has no default route"
    )


def _join(host: str, port: int, source: str) -> str:
    try:
        addr = ip_address(host.strip())
    except ValueError:
        raise IdentityError(f"{source}: {host!r} is not an IP address") from None
    joined = f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
    try:
        return check_endpoint(joined)  # the rules every peer applies to our entry
    except ValueError as exc:
        raise IdentityError(f"{source}: {host!r}: {exc}") from None
