"""EtcdRegistry's auth against a scripted gateway: token header, re-authentication, errors."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest

from vnetd.registry.etcd.client import EtcdRegistry, EtcdSecurity, RegistryAccessError
from vnetd.registry.etcd.security import tls_problem

URL = "http://etcd.test:2379"


class Gateway:
    """Answers like etcd 3.4's gateway with auth on; tokens can be expired by hand."""

    def __init__(self, password: str = "pw") -> None:
        self.password = password
        self.valid: set[str] = set()
        self.issued = 0
        self.seen_tokens: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        if request.url.path == "/v3/auth/authenticate":
            if body != {"name": "vnetd", "password": self.password}:
                return self.error(
                    400, 3, "etcdserver: authentication failed, invalid user ID or password"
                )
            self.issued += 1
            token = f"token-{self.issued}"
            self.valid.add(token)
            return httpx.Response(200, json={"header": {}, "token": token})
        token = request.headers.get("authorization")
        self.seen_tokens.append(token)
        if token is None:
            return self.error(400, 3, "etcdserver: user name is empty")
        if token not in self.valid:
            return self.error(401, 16, "etcdserver: invalid auth token")
        if body.get("key") != "L3Zu":  # base64("/vn")
            return self.error(403, 7, "etcdserver: permission denied")
        return httpx.Response(200, json={"header": {"revision": "3"}, "kvs": []})

    @staticmethod
    def error(status: int, code: int, message: str) -> httpx.Response:
        return httpx.Response(status, json={"error": message, "code": code, "message": message})


def registry(gateway: Gateway, password: str = "pw") -> EtcdRegistry:
    reg = EtcdRegistry([URL], security=EtcdSecurity(username="vnetd", password=password))
    reg._client = httpx.AsyncClient(transport=httpx.MockTransport(gateway))
    return reg


async def test_authenticates_once_and_again_when_the_token_expires() -> None:
    gateway = Gateway()
    reg = registry(gateway)
    assert await reg.get("/vn") is None
    assert await reg.get("/vn") is None
    assert gateway.issued == 1
    gateway.valid.clear()  # the token expired
    assert await reg.get("/vn") is None
    assert gateway.issued == 2
    assert gateway.seen_tokens == ["token-1", "token-1", "token-1", "token-2"]


async def test_a_wrong_password_is_one_line_naming_the_user() -> None:
    with pytest.raises(RegistryAccessError, match="authentication failed for user 'vnetd'") as info:
        await registry(Gateway(), password="guess").get("/vn")
    assert "guess" not in str(info.value)
    assert "\n" not in str(info.value)


async def test_a_key_outside_the_role_is_permission_denied_naming_the_key() -> None:
    with pytest.raises(RegistryAccessError, match="permission denied for user vnetd on key '/x'"):
        await registry(Gateway()).get("/x")


async def test_the_password_is_not_in_the_repr() -> None:
    assert "pw" not in repr(EtcdSecurity(username="vnetd", password="pw"))


def verify_error(message: str) -> ssl.SSLCertVerificationError:
    """What Python's ssl raises when etcd's certificate does not verify."""
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] ({message})")
    error.verify_message = message
    return error


@pytest.mark.parametrize(
    ("error", "line"),
    [
        pytest.param(verify_error("certificate has expired"),
                     "certificate verify failed (certificate has expired); renew etcd's server "
                     "certificate", id="server-certificate-expired"),
        pytest.param(verify_error("unable to get local issuer certificate"),
                     "certificate verify failed (unable to get local issuer certificate); check "
                     "--etcd-ca (registry.ca_file)", id="wrong-ca"),
    ],
)  # fmt: skip
def test_a_certificate_etcd_presents_that_does_not_verify_names_the_fix(
    error: ssl.SSLCertVerificationError, line: str
) -> None:
    wrapped = httpx.ConnectError("failed")
    wrapped.__cause__ = error
    problem = tls_problem(wrapped, "https://etcd:2379")
    assert problem is not None
    assert str(problem).startswith(f"etcd https://etcd:2379: {line}"), str(problem)
