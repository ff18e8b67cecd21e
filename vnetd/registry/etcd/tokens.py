"""etcd's auth tokens as ``EtcdRegistry`` keeps them, and what a refusal says about
our credentials (docs/security.md).

``POST /v3/auth/authenticate`` gives a token that goes in the ``Authorization``
header of every call; when etcd answers that the token is invalid (it expired, or
another member issued it: etcd's simple tokens are per member) the client forgets
it, authenticates again and retries once. A refusal that is about our credentials
(a wrong password, auth not enabled, a permission denied, no user given) becomes a
``RegistryAccessError`` that names the flag to fix.
"""

from __future__ import annotations

import httpx

from vnetd.errors import RegistryError
from vnetd.registry.etcd.gateway import (
    AUTHENTICATE,
    JSON,
    REQUIRE_LEADER,
    check_response,
    key_of,
)
from vnetd.registry.etcd.security import AuthRequired, EtcdSecurity, RegistryAccessError
from vnetd.registry.etcd.transport import (
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    Refused,
)


class AuthTokens:
    """The auth token of each endpoint of one client (none without a user)."""

    def __init__(self, security: EtcdSecurity) -> None:
        self._security = security
        self._tokens: dict[str, str] = {}
        """Auth token per endpoint (etcd's simple tokens are valid on their member only)."""

    async def headers(self, client: httpx.AsyncClient, endpoint: str) -> dict[str, str]:
        """The headers that authenticate a call on ``endpoint``, authenticating first
        if it has no token yet."""
        if self._security.username is None:
            return {}
        token = self._tokens.get(endpoint)
        if token is None:
            token = await self._authenticate(client, endpoint)
            self._tokens[endpoint] = token
        return {"Authorization": token}

    async def _authenticate(self, client: httpx.AsyncClient, endpoint: str) -> str:
        where = f"{endpoint}{AUTHENTICATE}"
        user = self._security.username
        credentials = {"name": user, "password": self._security.password or ""}
        response = await client.post(where, json=credentials, headers=REQUIRE_LEADER)
        try:
            data = check_response(response, where)
        except Refused as exc:
            if exc.code == INVALID_ARGUMENT or "authentication failed" in str(exc):
                raise RegistryAccessError(
                    f"etcd {endpoint}: authentication failed for user {user!r}; check "
                    "--etcd-user and the password (--etcd-password-file, VNETD_ETCD_PASSWORD)"
                ) from None
            if "authentication is not enabled" in str(exc):
                raise RegistryAccessError(
                    f"etcd {endpoint}: authentication is not enabled on this etcd; "
                    "drop --etcd-user, or enable auth (docs/security.md)"
                ) from None
            raise
        token = data.get("token")
        if not isinstance(token, str) or not token:
            raise RegistryError(f"etcd {where}: no token in the answer")
        return token

    def rejected(self, endpoint: str, exc: Refused) -> bool:
        """Forget a token etcd no longer accepts; True if authenticating again may help."""
        text = str(exc)
        if self._security.username is None:
            return False
        if exc.code == UNAUTHENTICATED or "invalid auth token" in text:
            self._tokens.pop(endpoint, None)
            return True
        return False

    def forget(self, endpoint: str) -> None:
        """Authenticate again before the next call on ``endpoint``."""
        self._tokens.pop(endpoint, None)

    def access_error(self, exc: Refused, endpoint: str, body: JSON) -> RegistryError:
        """``exc`` as the credential problem it says, or as itself."""
        text = str(exc)
        if exc.code == PERMISSION_DENIED or "permission denied" in text:
            user = self._security.username or "(none)"
            return RegistryAccessError(
                f"etcd {endpoint}: permission denied for user {user} on key {key_of(body)!r}; "
                "grant the user's role readwrite on the mesh prefix (docs/security.md)"
            )
        if "user name is empty" in text or exc.code == UNAUTHENTICATED:
            return AuthRequired(
                f"etcd {endpoint}: etcd requires authentication; give --etcd-user and "
                "--etcd-password-file (or VNETD_ETCD_USER, VNETD_ETCD_PASSWORD)"
            )
        return exc
