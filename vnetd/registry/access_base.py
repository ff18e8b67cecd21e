"""Roles and users of a registry that has access control, as records, and the
capability that applies them (``AccessControl``, beside the ``Registry`` protocol).

``vnetd.control.access`` computes an ``AccessPlan`` for a mesh; a backend that can enforce
it (``EtcdRegistry``, through etcd's auth API) applies it. See docs/security.md,
"Scoped credentials".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

READ = "READ"
READWRITE = "READWRITE"


@dataclass(frozen=True, order=True)
class Permission:
    """One permission: a key, or the keys starting with it when ``prefix``."""

    kind: str
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Role:
    name: str
    permissions: tuple[Permission, ...]


@dataclass(frozen=True)
class User:
    name: str
    roles: tuple[str, ...]
    scope: str
    """What the user may write, for reports (``mesh``, ``site burst``, ``rank 3``)."""


_OWN_ROLE = re.compile(r"read|mesh|rank-[0-9]+|site-[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""What follows a plan's role prefix in the names of its roles (``control.access``)."""


@dataclass(frozen=True)
class AccessPlan:
    """The roles and users of one mesh, sorted by name. The roles ``owns`` are the plan's
    own kind: a user's other roles of that kind are revoked, others kept."""

    role_prefix: str
    roles: tuple[Role, ...]
    users: tuple[User, ...]

    def owns(self, role: str) -> bool:
        """Whether ``role`` is one this mesh's plans make: ``role_prefix`` then ``read``,
        ``mesh``, ``rank-N`` or ``site-LABEL``. A prefix alone is not enough: mesh names
        may hold ``-``, and ``vnetd-prod-`` starts the roles of mesh ``prod-eu`` too. (A
        mesh named ``X-site-Y`` still looks like a site of ``X``: name meshes apart.)"""
        if not role.startswith(self.role_prefix):
            return False
        return _OWN_ROLE.fullmatch(role[len(self.role_prefix) :]) is not None


@runtime_checkable
class AccessControl(Protocol):
    """A registry that can make its roles and users those of a plan."""

    async def apply_access(
        self, plan: AccessPlan, password_for: Callable[[User], str]
    ) -> list[str]:
        """Create or update the plan's roles and users, idempotently; one line per change.
        ``password_for`` gives a new user's password (existing users keep theirs)."""
        ...

    async def auth_enabled(self) -> bool:
        """Whether the registry demands a user; asked through one opened without a user."""
        ...

    async def enable_auth(self, root_password: str) -> list[str]:
        """Make the administrator (with ``root_password`` if it is new) and turn access
        control on; one line per change. Called while it is off."""
        ...
