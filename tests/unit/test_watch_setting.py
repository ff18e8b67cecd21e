"""``[registry] watch`` and ``watch_endpoints``: the spec's keys, ``--etcd-watch`` and
``VNETD_ETCD_WATCH`` (flag, then environment, then spec), and the registry each opens."""

from __future__ import annotations

import pytest

from vnetd.config import registry_access
from vnetd.errors import SpecError
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.registry.etcd.grpc_watch import GrpcWatchRegistry
from vnetd.registry.opener import open_registry
from vnetd.spec import RegistrySpec, parse_spec

SPEC = {
    "mesh": {"name": "lab", "size": 4, "network": "10.250.0.0/24"},
    "registry": {"endpoints": ["http://127.0.0.1:2379"]},
}


def test_the_spec_defaults_to_the_json_watch_on_the_endpoints() -> None:
    registry = parse_spec(SPEC).registry
    assert (registry.watch, registry.watch_endpoints) == ("json", ())


def test_the_spec_names_a_grpc_watch_and_its_proxy() -> None:
    table = {**SPEC["registry"], "watch": "grpc", "watch_endpoints": ["http://10.0.0.9:23790"]}
    registry = parse_spec({**SPEC, "registry": table}).registry
    assert (registry.watch, registry.watch_endpoints) == ("grpc", ("http://10.0.0.9:23790",))


@pytest.mark.parametrize(
    ("flag", "env", "spec", "chosen"),
    [
        pytest.param("grpc", "json", "json", "grpc", id="flag-first"),
        pytest.param(None, "grpc", "json", "grpc", id="then-env"),
        pytest.param(None, None, "grpc", "grpc", id="then-spec"),
        pytest.param(None, None, "json", "json", id="default"),
    ],
)
def test_flag_then_environment_then_spec(
    flag: str | None, env: str | None, spec: str, chosen: str
) -> None:
    environment = {"VNETD_ETCD_WATCH": env} if env else {}
    resolved = registry_access(RegistrySpec(watch=spec), {"watch": flag}, environment)
    assert resolved.watch == chosen


def test_an_unknown_watch_in_the_environment_names_the_variable() -> None:
    with pytest.raises(SpecError, match=r"--etcd-watch \(VNETD_ETCD_WATCH, registry.watch\)"):
        registry_access(RegistrySpec(), {}, {"VNETD_ETCD_WATCH": "websocket"})


@pytest.mark.parametrize(
    ("watch", "kind"),
    [
        pytest.param("json", EtcdRegistry, id="json"),
        pytest.param("grpc", GrpcWatchRegistry, id="grpc"),
    ],  # fmt: skip
)
async def test_the_opener_opens_the_registry_the_setting_names(watch: str, kind: type) -> None:
    async with open_registry(RegistrySpec(watch=watch)) as registry:
        assert type(registry) is kind
