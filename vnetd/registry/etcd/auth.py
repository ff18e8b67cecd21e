"""Bring etcd's roles and users to an ``AccessPlan``, idempotently: a second run
changes nothing. Written for any transport: it makes the calls of
``transport.AuthCalls`` (``gateway.GatewayAuth`` sends them as ``/v3/auth/*``).

Each role ends with exactly the plan's permissions (missing ones granted, others
revoked); each user gets the plan's roles (other roles of this mesh, named
``vnetd-<mesh>-...``, revoked; roles it has from elsewhere kept). A user that does not
exist is created with the password ``password_for`` gives; an existing user's
password is never changed. Checked against etcd 3.4: adding a role or user that
exists answers HTTP 412 with gRPC code 9 (FAILED_PRECONDITION), granting a
permission or a role twice succeeds, ``READ`` (0) is omitted from answers.

``enable_auth`` is the deployment's last step (``vnetd provision --enable-auth``): the
user ``root`` with the role ``root`` (etcd refuses to enable auth without them), then
auth on. Checked against etcd 3.4.23: while auth is off any client may make users and
enable it; once on, a call naming no user is refused ("user name is empty", code 3)
and enabling it again as root answers success.
"""

from __future__ import annotations

from collections.abc import Callable

from vnetd.registry.access_base import AccessPlan, Permission, Role, User
from vnetd.registry.etcd.transport import FAILED_PRECONDITION, AuthCalls, Refused

ROOT = "root"
"""etcd's administrator: the user and the role it must have before auth may be enabled."""


async def apply_plan(
    api: AuthCalls, plan: AccessPlan, password_for: Callable[[User], str]
) -> list[str]:
    """Make etcd's roles and users those of ``plan``; returns one line per change.

    Raises:
        RegistryAccessError: our user may not manage auth (it needs etcd's ``root`` role).
        RegistryError: etcd refused a call for another reason.
    """
    changes: list[str] = []
    for role in plan.roles:
        changes += await _apply_role(api, role)
    for user in plan.users:
        changes += await _apply_user(api, user, plan, password_for)
    return changes


async def enable_auth(api: AuthCalls, root_password: str) -> list[str]:
    """Make user ``root`` (with ``root_password``, if it does not exist) hold the role
    ``root``, then turn auth on; one line per change. An existing root keeps its
    password. Call it while auth is off, after the plan is applied: users exist before
    anyone needs one.

    Raises:
        RegistryAccessError: auth is on already and this client names no user.
        RegistryError: etcd refused a call for another reason.
    """
    changes: list[str] = []
    roles = await _user_roles(api, ROOT)
    if roles is None:
        await api.add_user(ROOT, root_password)
        changes.append(f"user {ROOT}: created")
        roles = set()
    if ROOT not in roles:
        await api.grant_role(ROOT, ROOT)
        changes.append(f"user {ROOT}: granted role {ROOT}")
    await api.enable_auth()
    return [*changes, "auth: enabled"]


async def _apply_role(api: AuthCalls, role: Role) -> list[str]:
    changes: list[str] = []
    if await _role_created(api, role.name):
        changes.append(f"role {role.name}: created")
    have = await api.role_permissions(role.name)
    want = set(role.permissions)
    for permission in sorted(want - have):
        await api.grant_permission(role.name, permission)
        changes.append(f"role {role.name}: granted {_shown(permission)}")
    for permission in sorted(have - want):
        await api.revoke_permission(role.name, permission)
        changes.append(f"role {role.name}: revoked {_shown(permission)}")
    return changes


async def _apply_user(
    api: AuthCalls, user: User, plan: AccessPlan, password_for: Callable[[User], str]
) -> list[str]:
    changes: list[str] = []
    roles = await _user_roles(api, user.name)
    if roles is None:
        await api.add_user(user.name, password_for(user))
        changes.append(f"user {user.name}: created ({user.scope})")
        roles = set()
    for role in sorted(set(user.roles) - roles):
        await api.grant_role(user.name, role)
        changes.append(f"user {user.name}: granted role {role}")
    for role in sorted(r for r in roles - set(user.roles) if plan.owns(r)):
        await api.revoke_role(user.name, role)
        changes.append(f"user {user.name}: revoked role {role}")
    return changes


async def _user_roles(api: AuthCalls, name: str) -> set[str] | None:
    """The user's roles, or None if etcd has no such user."""
    try:
        return await api.user_roles(name)
    except Refused as exc:
        if exc.code == FAILED_PRECONDITION and "not found" in str(exc):
            return None
        raise


async def _role_created(api: AuthCalls, name: str) -> bool:
    """True if created, False if it already existed."""
    try:
        await api.add_role(name)
    except Refused as exc:
        if exc.code == FAILED_PRECONDITION and "already exists" in str(exc):
            return False
        raise
    return True


def _shown(permission: Permission) -> str:
    return f"{permission.kind.lower()} {permission.key}{'*' if permission.prefix else ''}"
