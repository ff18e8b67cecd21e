"""Bring etcd's roles and users to an ``AccessPlan`` through the JSON gateway's
``/v3/auth/*`` calls, idempotently: a second run changes nothing.

Each role ends with exactly the plan's permissions (missing ones granted, others
revoked); each user gets the plan's roles (other roles of this mesh, named
``vnetd-<mesh>-...``, revoked; roles it has from elsewhere kept). A user that does not
exist is created with the password ``password_for`` gives; an existing user's
password is never changed. Checked against etcd 3.4: adding a role or user that
exists answers HTTP 412 with gRPC code 9 (FAILED_PRECONDITION), granting a
permission or a role twice succeeds, ``READ`` (0) is omitted from answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from vnetd.registry.access_base import READ, AccessPlan, Permission, Role, User
from vnetd.registry.etcd_gateway import JSON, Refused, b64, prefix_end, unb64

FAILED_PRECONDITION = 9


class AuthApi(Protocol):
    """What applying a plan needs of a client: one gateway call (``EtcdRegistry.call``)."""

    async def call(self, path: str, body: JSON) -> JSON: ...


async def apply_plan(
    api: AuthApi, plan: AccessPlan, password_for: Callable[[User], str]
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


async def _apply_role(api: AuthApi, role: Role) -> list[str]:
    changes: list[str] = []
    if await _add(api, "/v3/auth/role/add", {"name": role.name}):
        changes.append(f"role {role.name}: created")
    answer = await api.call("/v3/auth/role/get", {"role": role.name})
    have = {_permission(raw) for raw in answer.get("perm", [])}
    want = set(role.permissions)
    for permission in sorted(want - have):
        body = {"name": role.name, "perm": {"permType": permission.kind, **_range(permission)}}
        await api.call("/v3/auth/role/grant", body)
        changes.append(f"role {role.name}: granted {_shown(permission)}")
    for permission in sorted(have - want):
        await api.call("/v3/auth/role/revoke", {"role": role.name, **_range(permission)})
        changes.append(f"role {role.name}: revoked {_shown(permission)}")
    return changes


async def _apply_user(
    api: AuthApi, user: User, plan: AccessPlan, password_for: Callable[[User], str]
) -> list[str]:
    changes: list[str] = []
    roles = await _user_roles(api, user.name)
    if roles is None:
        await api.call("/v3/auth/user/add", {"name": user.name, "password": password_for(user)})
        changes.append(f"user {user.name}: created ({user.scope})")
        roles = set()
    for role in sorted(set(user.roles) - roles):
        await api.call("/v3/auth/user/grant", {"user": user.name, "role": role})
        changes.append(f"user {user.name}: granted role {role}")
    for role in sorted(r for r in roles - set(user.roles) if plan.owns(r)):
        await api.call("/v3/auth/user/revoke", {"name": user.name, "role": role})
        changes.append(f"user {user.name}: revoked role {role}")
    return changes


async def _user_roles(api: AuthApi, name: str) -> set[str] | None:
    """The user's roles, or None if etcd has no such user."""
    try:
        answer = await api.call("/v3/auth/user/get", {"name": name})
    except Refused as exc:
        if exc.code == FAILED_PRECONDITION and "not found" in str(exc):
            return None
        raise
    return {str(role) for role in answer.get("roles", [])}


async def _add(api: AuthApi, path: str, body: JSON) -> bool:
    """True if created, False if it already existed."""
    try:
        await api.call(path, body)
    except Refused as exc:
        if exc.code == FAILED_PRECONDITION and "already exists" in str(exc):
            return False
        raise
    return True


def _range(permission: Permission) -> JSON:
    body: JSON = {"key": b64(permission.key)}
    if permission.prefix:
        body["range_end"] = b64(prefix_end(permission.key))
    return body


def _permission(raw: JSON) -> Permission:
    """A permission as etcd reports it; a range is ours only if it is a prefix's."""
    key = unb64(raw.get("key", "")).decode("utf-8", "surrogateescape")
    end = unb64(raw.get("range_end", ""))
    kind = str(raw.get("permType", READ))
    return Permission(kind, key, prefix=bool(end) and end == prefix_end(key))


def _shown(permission: Permission) -> str:
    return f"{permission.kind.lower()} {permission.key}{'*' if permission.prefix else ''}"
