"""The spec's parsing: TOML into ``MeshSpec``, every key checked with a one-line error.

Each error names the key and the fix (invariant 6).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from ipaddress import (
    IPv6Network,
    ip_address,
    ip_network,
)
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vnetd.errors import SpecError
from vnetd.spec.checks import check_keys, int_in, kind, spec_table
from vnetd.spec.records import (
    DATAPLANES,
    DEFAULT_DOCTOR_PORT,
    DEFAULT_DOORBELL_PORT,
    DEFAULT_SITE,
    DEFAULT_SITE_KEEPALIVE,
    DataplaneSpec,
    HttpSpec,
    IPNetwork,
    MeshSpec,
    RegistrySpec,
    SiteSpec,
    check_watch,
    min_mtu_of,
)

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9.-]*$")

_MESH_KEYS: dict[str, type] = {
    "name": str,
    "size": int,
    "network": str,
    "network6": str,
    "port": int,
    "interface": str,
    "mtu": int,  # or "auto": see _mtu
    "hostname": str,
    "offset": int,
    "persistent_keepalive": int,
    "site_keepalive": int,
    "doctor_port": int,
    "tree_fanout": int,
    "doorbell_port": int,
    "rank_ca": list,
}
_REGISTRY_KEYS: dict[str, type] = {
    "endpoints": list,
    "relays": list,
    "prefix": str,
    "lease_ttl": int,
    "ca_file": str,
    "cert_file": str,
    "key_file": str,
    "username": str,
    "password_file": str,
    "watch": str,
    "watch_endpoints": list,
}


_REGISTRY_FILES = ("ca_file", "cert_file", "key_file", "password_file")
_HTTP_KEYS: dict[str, type] = {"listen": str}
_REQUIRED = ("name", "size", "network")


def load_spec(path: Path | str) -> MeshSpec:
    """Read and validate a spec file.

    Raises:
        SpecError: the file is missing, not TOML, or invalid; the message
            names the file and the key.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def parse_spec(data: Mapping[str, Any]) -> MeshSpec:
    """Validate a parsed TOML document into a ``MeshSpec``."""
    unknown = sorted(set(data) - {"mesh", "registry", "http", "wireguard", "site", "sites"})
    if unknown:
        raise SpecError(
            f"unknown table or key {unknown[0]!r} "
            "(known: [mesh], [registry], [http], [wireguard], [site], [sites.NAME])"
        )
    mesh = dict(spec_table(data, "mesh"))
    mtu_value = mesh.pop("mtu", 1420)
    registry = spec_table(data, "registry")
    check_keys("mesh", mesh, _MESH_KEYS)
    check_keys("registry", registry, _REGISTRY_KEYS)
    http = spec_table(data, "http")
    check_keys("http", http, _HTTP_KEYS)
    for key in _REQUIRED:
        if key not in mesh:
            raise SpecError(f"mesh.{key}: missing (required)")

    name = _name(mesh["name"])
    size = int_in("mesh.size", mesh["size"], 1, 1 << 20)
    network = _network(mesh["network"])
    network6 = _network6(mesh["network6"], network) if "network6" in mesh else None
    offset = int_in("mesh.offset", mesh.get("offset", 1), 0, 1 << 32)
    _check_fits(size, offset, network)
    if network6 is not None:
        _check_fits(size, offset, network6, "mesh.network6")
    port = int_in("mesh.port", mesh.get("port", 51820), 1, 65535)
    interface = str(mesh.get("interface", "vnet0"))
    if not _IFNAME.fullmatch(interface):
        raise SpecError(
            f"mesh.interface: {interface!r} is not a valid interface name "
            "(1-15 characters of letters, digits, '_', '.', '-')"
        )
    mtu = _mtu(mtu_value, min_mtu_of((network,) if network6 is None else (network, network6)))
    hostname = _hostname(str(mesh.get("hostname", "{name}-{rank}")))
    keepalive = int_in("mesh.persistent_keepalive", mesh.get("persistent_keepalive", 0), 0, 65535)
    site_keepalive = int_in(
        "mesh.site_keepalive", mesh.get("site_keepalive", DEFAULT_SITE_KEEPALIVE), 0, 65535
    )

    doctor_port = int_in("mesh.doctor_port", mesh.get("doctor_port", DEFAULT_DOCTOR_PORT), 0, 65535)
    bell = int_in("mesh.doorbell_port", mesh.get("doorbell_port", DEFAULT_DOORBELL_PORT), 1, 65535)
    return MeshSpec(
        name=name,
        size=size,
        network=network,
        network6=network6,
        port=port,
        interface=interface,
        mtu=mtu,
        hostname=hostname,
        offset=offset,
        persistent_keepalive=keepalive,
        site_keepalive=site_keepalive,
        doctor_port=doctor_port,
        tree_fanout=int_in("mesh.tree_fanout", mesh.get("tree_fanout", 0), 0, 1 << 20),
        doorbell_port=bell,
        site=_site_spec(spec_table(data, "site")),
        gateways=_gateways(spec_table(data, "sites"), size),
        gateway_keys=_gateway_keys(spec_table(data, "sites")),
        rank_ca=_rank_ca(mesh["rank_ca"]) if "rank_ca" in mesh else (),
        registry=_registry(registry),
        http=HttpSpec(
            listen=check_listen(http["listen"], "http.listen") if "listen" in http else None
        ),
        local=_dataplane_spec(spec_table(data, "wireguard")),
    )


def _mtu(value: object, low: int) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f'mesh.mtu: expected an integer or "auto", got {kind(value)}')
    return int_in("mesh.mtu", value, low, 65535)


_WIREGUARD_KEYS: dict[str, type] = {
    "dataplane": str,
    "preshared_key_file": str,
    "signing_key_file": str,
    "rank_cert_file": str,
}


def _dataplane_spec(table: Mapping[str, Any]) -> DataplaneSpec:
    check_keys("wireguard", table, _WIREGUARD_KEYS)
    value = table.get("dataplane", "auto")
    if value not in DATAPLANES:
        raise SpecError(f"wireguard.dataplane: {value!r} is not one of {', '.join(DATAPLANES)}")
    return DataplaneSpec(
        dataplane=value,
        preshared_key_file=table.get("preshared_key_file"),
        signing_key_file=table.get("signing_key_file"),
        rank_cert_file=table.get("rank_cert_file"),
    )


_SITE_KEYS: dict[str, type] = {"name": str, "public_endpoint": str}


def _site_spec(table: Mapping[str, Any]) -> SiteSpec:
    check_keys("site", table, _SITE_KEYS)
    name = check_site_name(table.get("name", DEFAULT_SITE), "site.name")
    return SiteSpec(name=name, public_endpoint=table.get("public_endpoint") or None)


def _gateways(table: Mapping[str, Any], size: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``[sites.<name>] gateways = [ranks]``: every rank in range, on one site only."""
    found: list[tuple[str, tuple[int, ...]]] = []
    owner: dict[int, str] = {}
    for name in sorted(table):
        site = check_site_name(name, f"sites.{name}")
        entry = spec_table(table, name)
        check_keys(f"sites.{name}", entry, {"gateways": list, "gateway_keys": Mapping})
        ranks = entry.get("gateways", [])
        key = f"sites.{name}.gateways"
        if not ranks:
            raise SpecError(f"{key}: empty; list the site's gateway ranks or drop the table")
        for rank in ranks:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
                raise SpecError(f"{key}: {rank!r} is not a rank in 0..{size - 1}")
            if rank in owner:
                raise SpecError(f"{key}: rank {rank} is already a gateway of site {owner[rank]}")
            owner[rank] = site
        found.append((site, tuple(sorted(ranks))))
    return tuple(found)


def _gateway_keys(table: Mapping[str, Any]) -> tuple[tuple[int, str], ...]:
    """``[sites.<name>] gateway_keys = { RANK = "signing public key" }``: each key a
    rank of that site's ``gateways``, each value a base64 Ed25519 public key (checked
    after ``_gateways``, so the site tables are known good)."""
    # vnetd.model imports this package, so its rules are imported once it is loaded.
    from vnetd.model import is_ascii_number

    pins: list[tuple[int, str]] = []
    for name in sorted(table):
        entry = table[name]
        ranks = entry.get("gateways", [])
        for text, value in entry.get("gateway_keys", {}).items():
            key = f"sites.{name}.gateway_keys.{text[:20]}"
            if not is_ascii_number(text):
                raise SpecError(f"{key}: {text[:20]!r} is not a rank; name a rank of sites.{name}"
                                f".gateways {ranks}")  # fmt: skip
            if int(text) not in ranks:
                raise SpecError(f"{key}: rank {text} is not one of sites.{name}.gateways "
                                f"{ranks}; pin only the site's own gateway ranks")  # fmt: skip
            _ed25519_key(key, value, "a signing public key: give the gateway's",
                         "`vnetd signing-key`")  # fmt: skip
            pins.append((int(text), value))
    return tuple(sorted(pins))


def _ed25519_key(key: str, value: object, what: str, printed_by: str) -> None:
    """``value`` is a base64 Ed25519 public key, or a ``SpecError`` naming ``key``."""
    from vnetd.model import key_bytes  # as in _gateway_keys: model imports this package

    if not isinstance(value, str):
        raise SpecError(f"{key}: expected a string, got {kind(value)}")
    try:
        key_bytes(value)
    except ValueError:
        raise SpecError(
            f"{key}: {value[:60]!r} is not {what} (base64 of 32 bytes), as {printed_by} prints it"
        ) from None


def _rank_ca(values: list[Any]) -> tuple[str, ...]:
    """``[mesh] rank_ca = ["CA public key", ...]``: base64 Ed25519 public keys, each once,
    kept in the order given (the stored spec compares them as written)."""
    if not values:
        raise SpecError("mesh.rank_ca: empty; list the rank CA's public key or drop the key")
    for index, value in enumerate(values):
        key = f"mesh.rank_ca[{index}]"
        _ed25519_key(key, value, "an Ed25519 public key: give the rank CA's",
                     "`vnetd rank-ca --key-file FILE`")  # fmt: skip
        if value in values[:index]:
            raise SpecError(f"{key}: {value[:12]!r} is listed twice; list each CA once")
    return tuple(values)


def check_site_name(value: str, source: str) -> str:
    """A site name is a DNS label; returns it.

    Raises:
        SpecError: naming ``source`` (the flag, variable or key).
    """
    if not _NAME.fullmatch(value):
        raise SpecError(
            f"{source}: {value!r} is not a site name (a DNS label: lowercase letters, "
            "digits and '-', at most 63, no leading or trailing '-')"
        )
    return value


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise SpecError(
            f"mesh.name: {value!r} is not a DNS label "
            "(lowercase letters, digits and '-', at most 63, no leading or trailing '-')"
        )
    return value


def _network(value: str, key: str = "mesh.network") -> IPNetwork:
    try:
        return ip_network(value, strict=True)
    except ValueError as exc:
        raise SpecError(f"{key}: {value!r} is not a network in CIDR form: {exc}") from None


def _network6(value: str, network: IPNetwork) -> IPv6Network:
    """``mesh.network6``: an IPv6 network, beside an IPv4 ``mesh.network``."""
    network6 = _network(value, "mesh.network6")
    if not isinstance(network6, IPv6Network):
        raise SpecError(
            f"mesh.network6: {value!r} is not an IPv6 network; give an IPv6 CIDR "
            'such as "fd00:250::/64" (the IPv4 network goes in mesh.network)'
        )
    if network.version != 4:
        raise SpecError(
            f"mesh.network6: set, but mesh.network {str(network)!r} is IPv6 too; for dual "
            "stack make mesh.network IPv4, for IPv6 alone leave mesh.network6 out"
        )
    return network6


def _check_fits(size: int, offset: int, network: IPNetwork, key: str = "mesh.network") -> None:
    # IPv4 keeps the broadcast address free; IPv6 has none.
    last_usable = network.num_addresses - (2 if network.version == 4 else 1)
    if offset + size - 1 > last_usable:
        room = max(0, last_usable - offset + 1)
        what = "" if key == "mesh.network" else f"{key} "
        raise SpecError(
            f"mesh.size: {size} ranks do not fit in {what}{network} with offset {offset} "
            f"(room for {room}); use a larger network or a smaller size"
        )


def _hostname(value: str) -> str:
    if "{rank}" not in value:
        raise SpecError(f"mesh.hostname: {value!r} has no '{{rank}}' placeholder")
    rest = value.replace("{rank}", "").replace("{name}", "")
    if "{" in rest or "}" in rest or not _HOSTNAME.fullmatch(rest):
        raise SpecError(
            f"mesh.hostname: {value!r} may hold only letters, digits, '.', '-', "
            "and the placeholders {rank} and {name}"
        )
    return value


def _registry(table: Mapping[str, Any]) -> RegistrySpec:
    endpoints = table.get("endpoints", list(RegistrySpec.endpoints))
    if not endpoints:
        raise SpecError("registry.endpoints: empty; give at least one etcd URL")
    for url in endpoints:
        _check_url(url)
    prefix = table.get("prefix", RegistrySpec.prefix)
    if not prefix.startswith("/") or prefix.endswith("/") and prefix != "/":
        raise SpecError(f"registry.prefix: {prefix!r} must start with '/' and not end with '/'")
    relays = [check_relay_url(url, key="registry.relays") for url in table.get("relays", [])]
    ttl = int_in("registry.lease_ttl", table.get("lease_ttl", RegistrySpec.lease_ttl), 2, 3600)
    for key in (*_REGISTRY_FILES, "username"):
        if key in table and not table[key]:
            raise SpecError(f"registry.{key}: empty; give a value or leave the key out")
    watch = check_watch(table.get("watch", RegistrySpec.watch), "registry.watch")
    for url in table.get("watch_endpoints", ()):
        check_etcd_url(url, key="registry.watch_endpoints")
    return RegistrySpec(
        watch=watch,
        watch_endpoints=tuple(table.get("watch_endpoints", ())),
        endpoints=tuple(endpoints),
        prefix=prefix.rstrip("/"),
        lease_ttl=ttl,
        ca_file=table.get("ca_file"),
        cert_file=table.get("cert_file"),
        key_file=table.get("key_file"),
        username=table.get("username"),
        password_file=table.get("password_file"),
        relays=tuple(relays),
    )


def _check_url(url: object) -> None:
    if not isinstance(url, str):
        raise SpecError(f"registry.endpoints: expected strings, got {kind(url)}")
    check_etcd_url(url, key="registry.endpoints")


def check_etcd_url(url: str, key: str = "--etcd") -> str:
    """Validate an etcd client URL (``http://host:port``); returns it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"{key}: {url!r} is not an etcd URL like http://127.0.0.1:2379")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise SpecError(f"{key}: {url!r} has an invalid port") from None
    return url


def check_relay_url(url: object, key: str = "--relay") -> str:
    """Validate a ``vnetd relay`` URL (``http://host:port``, or ``https://`` for a relay
    with ``--tls-cert``, verified with ``registry.ca_file``); returns it."""
    if not isinstance(url, str):
        raise SpecError(f"{key}: {url!r}: give http://HOST:PORT (https:// for a relay with TLS)")
    return check_etcd_url(url, key)


def check_listen(value: str, key: str = "--http-listen") -> str:
    """Validate a ``host:port`` listen address (IPv6 hosts in brackets); returns it."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ok = bool(sep) and 0 <= int(port) <= 65535 and bool(ip_address(host))
    except ValueError:
        ok = False
    if not ok:
        raise SpecError(
            f"{key}: {value!r} is not an address and port like 0.0.0.0:9090 or [::]:9090"
        )
    return value
