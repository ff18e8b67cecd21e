"""``vnetd provision``: the etcd roles and users that scope a mesh's credentials.

    vnetd provision --config mesh.toml --etcd-user root --etcd-password-file root.pw \\
        --passwords ./secrets --site cloud=0-63 --site burst=64-127 --rank-users all

Run as an etcd user with the ``root`` role, once per mesh and again after any
change (idempotent: ``vnetd.registry.etcd.auth``). It also stores the mesh's spec
(create-if-absent), since site and rank users may only read it. A new user's
password is generated here and written to ``--passwords DIR/<user>`` (mode 0600,
never printed); a file already there is used as the password instead (a run that
failed part-way). Existing users keep their passwords. What each user may do:
docs/security.md, "Scoped credentials"; the plan itself is ``vnetd.control.access``.
Exit status: 0 done, 2 bad input or etcd refused.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from vnetd.config import add_etcd_arguments, spec_from_args
from vnetd.control.access import access_plan
from vnetd.errors import IdentityError, SpecError
from vnetd.ranks import parse_ranks
from vnetd.registry.access_base import AccessPlan, User
from vnetd.spec import MeshSpec

PASSWORD_BYTES = 24


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "provision",
        help="create the etcd roles and users that scope a mesh's credentials",
        description="Create or update, idempotently, etcd roles and users for the mesh: a "
        "mesh-wide user, one user per site that may claim only the site's ranks, and one "
        "user per rank that may write only its own entry (all read the mesh). Run as an "
        "etcd root user; it also stores the spec.",
        epilog="exit status: 0 done, 2 bad input or etcd refused",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    parser.add_argument(
        "--passwords",
        type=Path,
        metavar="DIR",
        help="where new users' passwords are written, one file per user (required "
        "unless --dry-run)",
    )
    parser.add_argument(
        "--mesh-user",
        metavar="NAME",
        help="name of the mesh-wide user (default vnetd-<mesh>); 'none': no such user",
    )
    parser.add_argument(
        "--site",
        action="append",
        default=[],
        metavar="NAME=RANKS",
        help="a site user that may claim only RANKS (e.g. burst=64-127); repeatable",
    )
    parser.add_argument(
        "--rank-users",
        metavar="RANKS",
        default="",
        help="ranks that get a user of their own (all, 0-7, 0,3,5-9)",
    )
    parser.add_argument(
        "--rank-user",
        metavar="PATTERN",
        help="a rank user's name, with {name} and {rank} (default: the spec's hostname "
        "pattern, i.e. the StatefulSet pod's name)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the roles and users; change nothing"
    )
    add_etcd_arguments(parser)
    parser.set_defaults(run=run)


def plan_of(args: argparse.Namespace, spec: MeshSpec) -> AccessPlan:
    """The plan the flags ask for (errors name the flag)."""
    sites: dict[str, tuple[int, ...]] = {}
    for item in args.site:
        name, equals, ranks = item.partition("=")
        if not equals or not name.strip():
            raise SpecError(f"--site {item!r}: give NAME=RANKS, e.g. burst=64-127")
        if name.strip() in sites:
            raise SpecError(f"--site {name.strip()}: given twice")
        sites[name.strip()] = parse_ranks(ranks, spec.size, f"--site {name.strip()}")
    mesh_user = args.mesh_user or f"vnetd-{spec.name}"
    ranks = parse_ranks(args.rank_users, spec.size, "--rank-users") if args.rank_users else ()
    return access_plan(
        spec,
        mesh_user=None if mesh_user == "none" else mesh_user,
        sites=sites,
        ranks=ranks,
        rank_user=args.rank_user or spec.hostname,
    )


def password_file(directory: Path, user: User) -> str:
    """The password for a new ``user``: read from ``directory/<name>`` if there, else
    generated and written there (0600, created exclusively, not through a symlink)."""
    path = directory / user.name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _existing_password(path)
    except OSError as exc:
        raise IdentityError(f"--passwords: cannot write {path}: {exc.strerror}") from None
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    with os.fdopen(fd, "w") as file:
        file.write(password + "\n")
        file.flush()
        os.fsync(file.fileno())
    return password


def _existing_password(path: Path) -> str:
    text = path.read_text().strip()
    if not text:
        raise IdentityError(f"--passwords: {path} is empty; delete it or write a password")
    return text


def run(args: argparse.Namespace) -> int:
    import trio

    spec = spec_from_args(args, os.environ)
    plan = plan_of(args, spec)
    if args.dry_run:
        for line in describe(plan):
            print(line)
        return 0
    if args.passwords is None:
        raise SpecError("--passwords: give the directory for new users' passwords")
    if not args.passwords.is_dir():
        raise SpecError(f"--passwords {args.passwords}: not a directory; create it (mode 0700)")
    changes = trio.run(provision, spec, plan, args.passwords)
    for line in changes or ["nothing to change"]:
        print(line)
    sys.stdout.flush()
    return 0


async def provision(spec: MeshSpec, plan: AccessPlan, passwords: Path) -> list[str]:
    """Store the spec and apply ``plan``; returns the changes made."""
    from vnetd.control.membership import ensure_spec, spec_key
    from vnetd.errors import RegistryError, plain_errors
    from vnetd.registry import open_registry
    from vnetd.registry.access_base import AccessControl

    with plain_errors():
        async with open_registry(spec.registry) as registry:
            if not isinstance(registry, AccessControl):
                raise RegistryError("registry: this backend has no users and roles to provision")
            stored = await ensure_spec(registry, spec)
            changes = [f"spec {spec_key(spec)}: stored"] if stored else []
            return changes + await registry.apply_access(
                plan, lambda user: password_file(passwords, user)
            )


def describe(plan: AccessPlan) -> list[str]:
    """One line per role and user, for ``--dry-run``."""
    lines = []
    for role in plan.roles:
        shown = ", ".join(
            f"{p.kind.lower()} {p.key}{'*' if p.prefix else ''}" for p in role.permissions
        )
        lines.append(f"role {role.name}: {shown}")
    lines += [f"user {user.name} ({user.scope}): {', '.join(user.roles)}" for user in plan.users]
    return lines
