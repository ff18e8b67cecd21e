"""The scoped-credential plan (``vnetd.control.access``) and its idempotent apply (``etcd.auth``),
against a stand-in for etcd's auth store that answers as etcd 3.4 was seen to
(``tests/e2e/test_scoped_credentials.py`` runs the same command against real etcd), and
``vnetd provision --enable-auth``'s order: users first, then auth on
(``tests/e2e/test_provision_auth.py`` against real etcd)."""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import trio

import vnetd.registry
from vnetd.commands import provision as provision_command
from vnetd.control.access import access_plan
from vnetd.control.membership import ensure_spec, spec_key
from vnetd.errors import RegistryUnavailable, SpecError
from vnetd.registry.access_base import READ, READWRITE, AccessPlan, Permission, User
from vnetd.registry.etcd.auth import apply_plan, enable_auth
from vnetd.registry.etcd.gateway import JSON, GatewayAuth, b64, unb64
from vnetd.registry.etcd.transport import Refused, prefix_end
from vnetd.registry.memory import MemoryRegistry
from vnetd.spec import parse_spec

SPEC = parse_spec({"mesh": {"name": "m", "size": 8, "network": "10.250.0.0/16"}})


class AuthStore:
    """Roles and users kept as etcd's ``/v3/auth/*`` calls change them."""

    def __init__(self) -> None:
        self.roles: dict[str, set[tuple[str, str, str]]] = {}
        self.users: dict[str, set[str]] = {}
        self.passwords: dict[str, str] = {}
        self.calls: list[str] = []
        self.enabled = False

    async def call(self, path: str, body: JSON) -> JSON:
        self.calls.append(path)
        verb = path.removeprefix("/v3/auth/")
        if verb == "role/add":
            if body["name"] in self.roles:
                raise Refused("etcdserver: role name already exists", 9)
            self.roles[body["name"]] = set()
        elif verb == "role/get":
            perms = [{"permType": t, "key": k, **({"range_end": e} if e else {})}
                     for t, k, e in self.roles[body["role"]]]  # fmt: skip
            return {"perm": [{k: v for k, v in p.items() if v != READ} for p in perms]}
        elif verb == "role/grant":
            perm = body["perm"]
            self.roles[body["name"]].add((perm["permType"], perm["key"], perm.get("range_end", "")))
        elif verb == "role/revoke":
            self.roles[body["role"]] = {
                p for p in self.roles[body["role"]] if p[1:] != (body["key"], body.get("range_end", ""))
            }  # fmt: skip
        elif verb == "user/get":
            if body["name"] not in self.users:
                raise Refused("etcdserver: user name not found", 9)
            return {"roles": sorted(self.users[body["name"]])}
        elif verb == "user/add":
            self.users[body["name"]] = set()
            self.passwords[body["name"]] = body["password"]
        elif verb == "user/grant":
            self.users[body["user"]].add(body["role"])
        elif verb == "user/revoke":
            self.users[body["name"]].discard(body["role"])
        elif verb == "enable":
            if "root" not in self.users.get("root", set()):
                raise Refused("etcdserver: root user does not have root role", 9)
            self.enabled = True
        return {}


def plan(**changes: object) -> object:
    given: dict[str, object] = {
        "mesh_user": "vnetd-m",
        "sites": {},
        "ranks": (),
        "rank_user": "m-{rank}",
    }
    given.update(changes)
    return access_plan(SPEC, **given)  # type: ignore[arg-type]


def test_a_rank_user_writes_only_its_member_key_and_reads_the_mesh() -> None:
    result = access_plan(SPEC, mesh_user=None, sites={}, ranks=(3,), rank_user="{name}-{rank}")
    roles = {role.name: role.permissions for role in result.roles}
    assert roles == {
        "vnetd-m-read": (Permission(READ, "/vnetd/m/", prefix=True),),
        "vnetd-m-rank-3": (Permission(READWRITE, "/vnetd/m/members/3"),),
    }
    assert result.users == (User("m-3", ("vnetd-m-read", "vnetd-m-rank-3"), "rank 3"),)


def test_the_relay_user_only_reads_the_mesh() -> None:
    result = plan(mesh_user=None, relay_user="vnetd-m-relay")
    assert result.users == (User("vnetd-m-relay", ("vnetd-m-read",), "relay"),)  # type: ignore[attr-defined]


def test_a_site_role_holds_one_key_per_rank_of_the_site() -> None:
    result = access_plan(
        SPEC, mesh_user=None, sites={"burst": (5, 6)}, ranks=(), rank_user="x{rank}"
    )
    (site,) = [role for role in result.roles if role.name == "vnetd-m-site-burst"]
    assert [p.key for p in site.permissions] == ["/vnetd/m/members/5", "/vnetd/m/members/6"]
    assert all(p.kind == READWRITE and not p.prefix for p in site.permissions)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        pytest.param({"sites": {"a": (1,), "b": (1, 2)}}, "rank 1 is on sites a and b", id="rank-on-two-sites"),
        pytest.param({"ranks": (1,), "rank_user": "fixed"}, "must contain {rank}", id="pattern-without-rank"),
        pytest.param({"ranks": (1,), "mesh_user": "m-1"}, "both the", id="user-name-clash"),
    ],
)  # fmt: skip
def test_bad_plans_name_the_flag(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=needle.replace("{", r"\{").replace("}", r"\}")):
        plan(**changes)


async def test_apply_creates_everything_once_and_a_second_run_changes_nothing() -> None:
    store = AuthStore()
    wanted = plan(sites={"burst": (6, 7)}, ranks=(0, 1))
    first = await apply_plan(GatewayAuth(store.call), wanted, lambda user: f"pw-{user.name}")  # type: ignore[arg-type]
    assert "user m-0: created (rank 0)" in first
    assert store.passwords["m-1"] == "pw-m-1"
    assert store.users["m-0"] == {"vnetd-m-read", "vnetd-m-rank-0"}
    assert store.roles["vnetd-m-read"] == {("READ", b64("/vnetd/m/"), b64(prefix_end("/vnetd/m/")))}
    before = len(store.calls)
    again = await apply_plan(
        GatewayAuth(store.call), wanted, lambda user: pytest.fail("asked for a password")
    )  # type: ignore[arg-type]
    assert again == []
    writes = {"/v3/auth/user/add", "/v3/auth/role/grant", "/v3/auth/user/grant"}
    assert not writes & set(store.calls[before:])


async def test_apply_revokes_what_the_plan_no_longer_has_and_keeps_foreign_roles() -> None:
    store = AuthStore()
    await apply_plan(GatewayAuth(store.call), plan(sites={"burst": (6, 7)}), lambda u: "pw")  # type: ignore[arg-type]
    store.users["vnetd-m-site-burst"].add("ops-readers")
    changes = await apply_plan(GatewayAuth(store.call), plan(sites={"burst": (7,)}), lambda u: "pw")  # type: ignore[arg-type]
    assert changes == ["role vnetd-m-site-burst: revoked readwrite /vnetd/m/members/6"]
    assert {unb64(k).decode() for _, k, _ in store.roles["vnetd-m-site-burst"]} == {
        "/vnetd/m/members/7"
    }
    assert "ops-readers" in store.users["vnetd-m-site-burst"]


class ReadOnlySpec(MemoryRegistry):
    """A registry where the spec may be read but any transaction on it is refused."""

    async def create(self, key: str, value: bytes, lease: int = 0) -> object:  # type: ignore[override]
        if key == spec_key(SPEC):
            raise Refused("etcdserver: permission denied", 7)
        return await super().create(key, value, lease)


async def test_a_stored_spec_is_compared_without_a_write() -> None:
    registry = ReadOnlySpec()
    await MemoryRegistry.create(registry, spec_key(SPEC), SPEC.canonical_json())
    assert await ensure_spec(registry, SPEC) is False


async def test_apply_keeps_the_roles_of_a_mesh_whose_name_extends_ours() -> None:
    store = AuthStore()
    await apply_plan(GatewayAuth(store.call), plan(), lambda u: "pw")  # type: ignore[arg-type]
    store.users["vnetd-m"] |= {"vnetd-m-eu-read", "vnetd-m-eu-mesh", "vnetd-m-rank-9"}
    changes = await apply_plan(GatewayAuth(store.call), plan(), lambda u: "pw")  # type: ignore[arg-type]
    assert changes == ["user vnetd-m: revoked role vnetd-m-rank-9"]
    assert {"vnetd-m-eu-read", "vnetd-m-eu-mesh"} <= store.users["vnetd-m"]


async def test_enable_auth_makes_root_with_its_role_and_turns_auth_on_last() -> None:
    store = AuthStore()
    changes = await enable_auth(GatewayAuth(store.call), "root-secret")
    assert changes == ["user root: created", "user root: granted role root", "auth: enabled"]
    assert store.passwords["root"] == "root-secret" and store.enabled
    assert store.calls[-1] == "/v3/auth/enable"


async def test_enable_auth_keeps_an_existing_roots_password() -> None:
    store = AuthStore()
    store.users["root"], store.passwords["root"] = set(), "chosen-before"
    changes = await enable_auth(GatewayAuth(store.call), "other")
    assert changes == ["user root: granted role root", "auth: enabled"]
    assert store.passwords["root"] == "chosen-before"


class AuthEtcd:
    """One etcd's auth state, shared by the registries ``open_registry`` opens on it."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.events: list[str] = []
        self.store = MemoryRegistry()

    @asynccontextmanager
    async def open(self, settings: object) -> AsyncIterator[object]:
        yield AuthRegistry(self, getattr(settings, "username", None))


class AuthRegistry(MemoryRegistry):
    """``AccessControl`` on an ``AuthEtcd``: it logs what is done and by whom."""

    def __init__(self, etcd: AuthEtcd, user: str | None) -> None:
        super().__init__()
        self.etcd, self.user = etcd, user

    async def get(self, key: str) -> object:  # type: ignore[override]
        return await self.etcd.store.get(key)

    async def create(self, key: str, value: bytes, lease: int = 0) -> object:  # type: ignore[override]
        return await self.etcd.store.create(key, value, lease)

    async def apply_access(
        self, plan: AccessPlan, password_for: Callable[[User], str]
    ) -> list[str]:
        self.etcd.events.append(f"plan as {self.user}")
        return [f"user {u.name}: created ({u.scope})" for u in plan.users]

    async def auth_enabled(self) -> bool:
        assert self.user is None, "asked through a registry with a user"
        return self.etcd.enabled

    async def enable_auth(self, root_password: str) -> list[str]:
        assert root_password == "root-secret"
        self.etcd.events.append(f"enable as {self.user}")
        self.etcd.enabled = True
        return ["auth: enabled"]


ROOT = replace(SPEC.registry, username="root", password="root-secret")


@pytest.mark.parametrize(
    ("enabled", "events", "last"),
    [
        pytest.param(False, ["plan as None", "enable as None"], "auth: enabled", id="auth-off"),
        pytest.param(True, ["plan as root"], "user vnetd-m: created (mesh)", id="auth-on"),
    ],
)
async def test_enable_auth_applies_the_plan_before_auth_is_on_and_as_root_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, enabled: bool, events: list[str], last: str
) -> None:
    etcd = AuthEtcd(enabled=enabled)
    monkeypatch.setattr(vnetd.registry, "open_registry", etcd.open)
    mesh = provision_command.MeshAccess(SPEC, plan(), tmp_path)
    changes = await provision_command.provision(ROOT, mesh, "root-secret")
    assert etcd.events == events
    assert changes[-1] == last
    assert etcd.enabled
    again = await provision_command.provision(ROOT, mesh, "root-secret")
    assert etcd.events[len(events) :] == ["plan as root"] and "auth: enabled" not in again


@pytest.mark.parametrize("enabled", [False, True])
async def test_without_a_spec_only_root_and_auth_are_made(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    """``vnetd provision --enable-auth`` without ``--config``: the Job etcd-auth."""
    etcd = AuthEtcd(enabled=enabled)
    monkeypatch.setattr(vnetd.registry, "open_registry", etcd.open)
    changes = await provision_command.provision(ROOT, None, "root-secret")
    assert (etcd.events, changes) == (
        ([], []) if enabled else (["enable as None"], ["auth: enabled"])
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param([], "--config: give the mesh spec", id="no-config-no-enable-auth"),
        pytest.param(["--enable-auth"], "--etcd: give etcd's client URL", id="no-etcd"),
        pytest.param(["--enable-auth", "--etcd", "http://e:2379"], "--enable-auth: give",
                     id="no-root"),
        pytest.param(["--enable-auth", "--wait", "-1"], "--wait -1", id="negative-wait"),
    ],
)  # fmt: skip
def test_provision_without_a_spec_names_the_missing_flag(argv: list[str], needle: str) -> None:
    from vnetd.cli import build_parser

    args = build_parser().parse_args(["provision", *argv])
    with pytest.raises(SpecError, match=re.escape(needle)):
        provision_command.run(args)


@pytest.mark.parametrize(
    ("user", "password"),
    [pytest.param(None, None, id="no-user"), pytest.param("vnetd-m", "pw", id="not-root"),
     pytest.param("root", None, id="no-password")],
)  # fmt: skip
def test_enable_auth_needs_roots_credentials(user: str | None, password: str | None) -> None:
    registry = replace(SPEC.registry, username=user, password=password)
    with pytest.raises(SpecError, match="--enable-auth: give --etcd-user root"):
        provision_command.root_password_of(registry)


async def test_wait_tries_again_while_etcd_is_unreachable_and_gives_up_at_its_bound(
    autojump_clock: object,
) -> None:
    tries: list[float] = []

    async def unreachable_twice() -> str:
        tries.append(trio.current_time())
        if len(tries) <= 2:
            raise RegistryUnavailable("etcd down")
        return "done"

    assert await provision_command.waiting(30, unreachable_twice) == "done"
    assert len(tries) == 3
    tries.clear()

    async def never() -> str:
        tries.append(trio.current_time())
        raise RegistryUnavailable("etcd down")

    start = trio.current_time()
    with pytest.raises(RegistryUnavailable):
        await provision_command.waiting(20, never)
    assert trio.current_time() - start <= 20 and len(tries) > 3


def test_provision_parses_enable_auth_and_wait() -> None:
    from vnetd.cli import build_parser

    args = build_parser().parse_args(
        ["provision", "--config", "m.toml", "--enable-auth", "--wait", "300", "--passwords", "d"]
    )
    assert isinstance(args, argparse.Namespace) and args.enable_auth and args.wait == 300
