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

``--enable-auth`` makes it the deployment's step that locks etcd down (docs/kubernetes.md,
"etcd with auth on"): given ``--etcd-user root`` and root's password, it asks etcd
without a user whether auth is on; if not, it applies the plan unauthenticated, makes
the user ``root`` with that password (if absent) and turns auth on, so every user exists
before auth is; if auth is on, it applies the plan as root. Without ``--config`` it
does only that last step, for etcd alone (``--etcd`` names it; the Job ``etcd-auth`` of
manifests/etcd). ``--wait S`` tries again for up to S seconds while etcd does not
answer or does not take the credential yet (a Job started beside etcd).
Exit status: 0 done, 2 bad input or etcd refused.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from vnetd.config import add_etcd_arguments, registry_from_args, spec_from_args
from vnetd.control.access import access_plan
from vnetd.errors import IdentityError, SpecError
from vnetd.ranks import parse_ranks
from vnetd.registry.access_base import AccessControl, AccessPlan, User
from vnetd.registry.base import Registry
from vnetd.spec import MeshSpec, RegistrySpec

PASSWORD_BYTES = 24
ROOT_USER = "root"
"""The user ``--enable-auth`` needs: etcd enables auth only once a user ``root`` exists."""
WAIT_BACKOFF = (0.5, 5.0)
"""``--wait``'s first and longest pause between tries, in seconds."""

T = TypeVar("T")


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
    parser.add_argument(
        "--config",
        type=Path,
        help="the mesh spec (TOML); without it only --enable-auth's root and auth steps run",
    )
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
        "--relay-user",
        metavar="NAME",
        help="also a user for vnetd relay, which may only read the mesh (default: none)",
    )
    parser.add_argument(
        "--enable-auth",
        action="store_true",
        help="also make the user root (password: --etcd-password-file) and turn etcd's "
        "auth on, once the roles and users exist; needs --etcd-user root",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="try again for up to SECONDS while etcd does not answer or does not take the "
        "credential yet (default 0)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the roles and users; change nothing"
    )
    add_etcd_arguments(parser, relays=False)
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
        relay_user=args.relay_user,
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


@dataclass(frozen=True)
class MeshAccess:
    """A mesh's part of a run: its spec to store, its plan, where new passwords go."""

    spec: MeshSpec
    plan: AccessPlan
    passwords: Path


def run(args: argparse.Namespace) -> int:
    import trio

    if args.wait < 0:
        raise SpecError(f"--wait {args.wait:g}: give 0 or more seconds")
    if args.config is None:
        if not args.enable_auth or args.dry_run:
            raise SpecError("--config: give the mesh spec (only --enable-auth runs without one)")
        settings = registry_from_args(args, os.environ)
        root = root_password_of(settings)
        return report(trio.run(waiting, args.wait, lambda: provision(settings, None, root)))
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
    root_password = root_password_of(spec.registry) if args.enable_auth else None
    mesh = MeshAccess(spec, plan, args.passwords)
    changes = trio.run(waiting, args.wait, lambda: provision(spec.registry, mesh, root_password))
    return report(changes)


def report(changes: list[str]) -> int:
    for line in changes or ["nothing to change"]:
        print(line)
    sys.stdout.flush()
    return 0


def root_password_of(registry: RegistrySpec) -> str:
    """Root's password for ``--enable-auth``, from the etcd flags (errors name them)."""
    if registry.username != ROOT_USER or not registry.password:
        raise SpecError(
            f"--enable-auth: give --etcd-user {ROOT_USER} and --etcd-password-file with "
            f"{ROOT_USER}'s password (etcd enables auth only once user {ROOT_USER} exists; "
            "it is made with that password if absent)"
        )
    return registry.password


async def waiting(seconds: float, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, tried again while the registry is unavailable, for up to
    ``seconds`` (each failure one line on stderr; the last one is raised)."""
    import trio

    from vnetd.control.retry import Backoff
    from vnetd.errors import RegistryUnavailable

    deadline = trio.current_time() + seconds
    backoff = Backoff(*WAIT_BACKOFF)
    while True:
        try:
            return await attempt()
        except RegistryUnavailable as exc:
            delay = backoff.next_delay()
            if trio.current_time() + delay > deadline:
                raise
            print(f"provision: {exc}; trying again in {delay:.1f} s", file=sys.stderr)
            await trio.sleep(delay)


async def provision(
    settings: RegistrySpec, mesh: MeshAccess | None, root_password: str | None = None
) -> list[str]:
    """Store ``mesh``'s spec and apply its plan; with ``root_password``, also make root
    and turn auth on if it is off (the module's docstring). Returns the changes made."""
    from vnetd.errors import plain_errors
    from vnetd.registry import open_registry

    with plain_errors():
        if root_password is not None:
            anonymous = replace(settings, username=None, password=None, password_file=None)
            async with open_registry(anonymous) as registry:
                access = access_control(registry)
                if not await access.auth_enabled():
                    changes = await apply(registry, mesh) if mesh else []
                    return changes + await access.enable_auth(root_password)
            if mesh is None:
                return []
        async with open_registry(settings) as registry:
            return await apply(registry, mesh) if mesh else []


def access_control(registry: Registry) -> AccessControl:
    from vnetd.errors import RegistryError

    if not isinstance(registry, AccessControl):
        raise RegistryError("registry: this backend has no users and roles to provision")
    return registry


async def apply(registry: Registry, mesh: MeshAccess) -> list[str]:
    """The mesh's spec stored (create-if-absent) and its plan applied through ``registry``."""
    from vnetd.control.membership import ensure_spec, spec_key

    stored = await ensure_spec(registry, mesh.spec)
    changes = [f"spec {spec_key(mesh.spec)}: stored"] if stored else []
    return changes + await access_control(registry).apply_access(
        mesh.plan, lambda user: password_file(mesh.passwords, user)
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
