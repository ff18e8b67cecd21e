"""Call etcd's JSON gateway as one user, the way an attacker holding that credential
would: ``python etcd_as.py URL CA CERT KEY USER PASSWORD_FILE OPS_JSON``.

OPS_JSON is a list of operations, each ``[verb, *args]``: ``["get", key]``,
``["put", key, value]``, ``["put_lease", key, value, lease]``, ``["delete", key]``,
``["keepalive", lease]``, ``["revoke", lease]``, and the auth API's ``["user_add",
name, password]``, ``["role_add", name]``, ``["auth_disable"]``. Prints one JSON list with, per
operation, ``{"status": HTTP status, "code": gRPC code or null, "text": start of the
body}``. USER ``-`` sends no token (only the certificate). Run inside a lab pod.
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
from typing import Any

import httpx


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def request(verb: str, args: list[Any]) -> tuple[str, dict[str, Any]]:
    if verb == "get":
        return "/v3/kv/range", {"key": b64(args[0])}
    if verb == "put":
        return "/v3/kv/put", {"key": b64(args[0]), "value": b64(args[1])}
    if verb == "put_lease":
        return "/v3/kv/put", {"key": b64(args[0]), "value": b64(args[1]), "lease": str(args[2])}
    if verb == "delete":
        return "/v3/kv/deleterange", {"key": b64(args[0])}
    if verb == "keepalive":
        return "/v3/lease/keepalive", {"ID": str(args[0])}
    if verb == "revoke":
        return "/v3/lease/revoke", {"ID": str(args[0])}
    if verb == "user_add":
        return "/v3/auth/user/add", {"name": args[0], "password": args[1]}
    if verb == "role_add":
        return "/v3/auth/role/add", {"name": args[0]}
    if verb == "auth_disable":
        return "/v3/auth/disable", {}
    raise SystemExit(f"unknown operation {verb}")


def main() -> None:
    url, ca, cert, key, user, password_file, ops = sys.argv[1:8]
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    results = []
    with httpx.Client(timeout=10, verify=context) as client:
        headers = {}
        if user != "-":
            password = open(password_file).read().strip()  # noqa: PTH123, SIM115
            answer = client.post(f"{url}/v3/auth/authenticate",
                                 json={"name": user, "password": password})  # fmt: skip
            if answer.status_code != 200:
                print(json.dumps([{"status": answer.status_code, "code": None,
                                   "text": answer.text[:200]}]))  # fmt: skip
                return
            headers["Authorization"] = answer.json()["token"]
        for verb, *args in json.loads(ops):
            path, body = request(verb, args)
            response = client.post(f"{url}{path}", json=body, headers=headers)
            try:
                code = response.json().get("code")
            except ValueError:
                code = None
            results.append({"status": response.status_code, "code": code,
                            "text": response.text[:300]})  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
