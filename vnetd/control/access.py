"""The etcd roles and users that scope a mesh's credentials (docs/security.md, "Scoped
credentials"): pure, so ``vnetd provision --dry-run`` and the apply step read one plan.

Three scopes, each a role; a writer gets the read role plus exactly one writer role:

* the mesh: ``readwrite`` on ``<prefix>/<mesh>/`` (the single credential of today);
* a site: ``readwrite`` on the member key of each of the site's ranks;
* a rank: ``readwrite`` on its own member key only.

A fourth user, the relays' (``vnetd relay``), gets ``read`` alone. Site and rank users
also get ``read`` on the mesh prefix (they list and watch every
member and compare the spec, which ``vnetd provision`` stores). A member key is one
etcd key per rank, so a site role holds one permission per rank: rank keys are not
zero-padded (docs/architecture.md, "Registry layout"), so a rank range is not a key
range, and the layout stays the one every version reads.
"""

from __future__ import annotations

from vnetd.control.membership import member_key, mesh_prefix
from vnetd.errors import SpecError
from vnetd.registry.access_base import READ, READWRITE, AccessPlan, Permission, Role, User
from vnetd.spec import MeshSpec, check_site_name


def role_prefix(spec: MeshSpec) -> str:
    return f"vnetd-{spec.name}"


def access_plan(
    spec: MeshSpec,
    *,
    mesh_user: str | None,
    sites: dict[str, tuple[int, ...]],
    ranks: tuple[int, ...],
    rank_user: str,
    relay_user: str | None = None,
) -> AccessPlan:
    """The roles and users for ``spec``'s mesh.

    Args:
        mesh_user: the name of the mesh-wide user; None: no such user.
        sites: the ranks of each site that gets a site user.
        ranks: the ranks that get a user of their own.
        rank_user: the pattern of a rank user's name, with ``{name}`` and ``{rank}``
            (the spec's hostname pattern by default: the StatefulSet pod's name).
        relay_user: the name of the relays' user (``vnetd relay``: the read role
            alone); None: no such user.

    Raises:
        SpecError: a site is named twice, a rank is on two sites, or a name pattern
            makes two users of one name.
    """
    base = role_prefix(spec)
    prefix = mesh_prefix(spec)
    read = Role(f"{base}-read", (Permission(READ, prefix, prefix=True),))
    roles: list[Role] = [read]
    users: list[User] = []
    if mesh_user is not None:
        writer = Role(f"{base}-mesh", (Permission(READWRITE, prefix, prefix=True),))
        roles.append(writer)
        users.append(User(mesh_user, (writer.name,), "mesh"))
    owner: dict[int, str] = {}
    for site, site_ranks in sorted(sites.items()):
        check_site_name(site, f"--site {site}")
        for rank in site_ranks:
            if rank in owner:
                raise SpecError(f"--site: rank {rank} is on sites {owner[rank]} and {site}")
            owner[rank] = site
        role = Role(f"{base}-site-{site}", _member_keys(spec, site_ranks))
        roles.append(role)
        users.append(User(f"{base}-site-{site}", (read.name, role.name), f"site {site}"))
    for rank in ranks:
        role = Role(f"{base}-rank-{rank}", _member_keys(spec, (rank,)))
        roles.append(role)
        users.append(User(rank_user_name(spec, rank_user, rank), (read.name, role.name),
                          f"rank {rank}"))  # fmt: skip
    if relay_user is not None:
        users.append(User(relay_user, (read.name,), "relay"))
    _check_unique(users)
    return AccessPlan(
        f"{base}-",
        tuple(sorted(roles, key=lambda r: r.name)),
        tuple(sorted(users, key=lambda u: u.name)),
    )


def rank_user_name(spec: MeshSpec, pattern: str, rank: int) -> str:
    """``pattern`` with ``{name}`` and ``{rank}`` filled in (``{name}-{rank}``: ``flux-3``)."""
    if "{rank}" not in pattern:
        raise SpecError(f"--rank-user {pattern!r}: must contain {{rank}} (one user per rank)")
    return pattern.replace("{name}", spec.name).replace("{rank}", str(rank))


def _member_keys(spec: MeshSpec, ranks: tuple[int, ...]) -> tuple[Permission, ...]:
    return tuple(Permission(READWRITE, member_key(spec, rank)) for rank in sorted(ranks))


def _check_unique(users: list[User]) -> None:
    seen: dict[str, str] = {}
    for user in users:
        if user.name in seen:
            raise SpecError(
                f"user {user.name!r} would be both the {seen[user.name]} and the {user.scope} "
                "user; change --mesh-user or --rank-user"
            )
        seen[user.name] = user.scope
