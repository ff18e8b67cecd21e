"""MPI host files of a mesh: Open MPI, MPICH (Hydra) and plain (PBS_NODEFILE style).

Names are overlay addresses by default: they resolve without any hosts
file. In a dual-stack mesh they are the primary (``network``) addresses
unless ``family`` chooses the other. The file has no comment lines, since a
plain node file is often read with ``wc -l`` or ``sort -u``. MPICH's Hydra
splits ``NAME:N`` at every ``:``, so an MPICH file of IPv6 addresses is
refused: use hostnames.
"""

from __future__ import annotations

from typing import Literal

from vnetd.spec import MeshSpec

HostfileFormat = Literal["openmpi", "mpich", "plain"]
NameKind = Literal["address", "hostname"]

FORMATS: tuple[HostfileFormat, ...] = ("openmpi", "mpich", "plain")
NAME_KINDS: tuple[NameKind, ...] = ("address", "hostname")


def render_hostfile(
    spec: MeshSpec,
    fmt: HostfileFormat = "openmpi",
    slots: int = 1,
    names: NameKind = "address",
    family: int | None = None,
) -> str:
    """One entry per rank, in rank order, ending in a newline.

    ``openmpi``: ``NAME slots=N``; ``mpich``: ``NAME:N``; ``plain``: ``NAME``
    repeated N times, one line per slot.

    Args:
        family: with ``names="address"``, the IP version (4 or 6) whose
            addresses are written; None: the primary network's.

    Raises:
        ValueError: ``slots`` is less than 1, the mesh has no network of
            ``family``, or MPICH with IPv6 addresses, which Hydra cannot parse
            (the command checks all three first).
    """
    if slots < 1:
        raise ValueError(f"slots {slots} is less than 1")
    version = spec.network.version if family is None else family
    if version not in spec.versions:
        raise ValueError(f"mesh {spec.name} has no IPv{version} network")
    if fmt == "mpich" and names == "address" and version == 6:
        raise ValueError("an MPICH host file cannot hold IPv6 addresses")
    lines: list[str] = []
    for rank in range(spec.size):
        name = str(spec.address_in(rank, version)) if names == "address" else spec.host(rank)
        if fmt == "openmpi":
            lines.append(f"{name} slots={slots}")
        elif fmt == "mpich":
            lines.append(f"{name}:{slots}")
        else:
            lines.extend([name] * slots)
    return "\n".join(lines) + "\n"
