"""The spec file, the flags and the environment of a command, resolved once.

A command that reaches the registry builds its settings record here in one
call from its parsed command line (``settings_from_args``): the spec file,
then ``--etcd`` URLs, then the etcd TLS and auth settings (flag, then
environment, then ``[registry]``; the password file is read), then
``--http-listen``. ``vnetd up``'s record, ``Settings``, keeps its own flags as
given: ``vnetd.daemon_settings`` resolves them, with the environment and the
host's facts, into the one record the daemon runs with (and ``vnetd.identity``
holds the rules of rank, endpoint, instance and site). See the module map in
docs/architecture.md. Secrets come from files (or ``VNETD_ETCD_PASSWORD``),
never from a flag's value.

The etcd access flags are declared and resolved here, not in the registry
package: they are flags and environment with the same precedence as every
other setting, and resolving them needs nothing but the spec. So this module
imports the pure core, the registry port opens a backend from a spec that is
already resolved and knows no flag, and building the parsers imports no
client library.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

from vnetd.dataplane.codec.uapi_protocol import UPSTREAM_SOCKET_DIR
from vnetd.errors import SpecError
from vnetd.spec import (
    WATCH_TRANSPORTS,
    HttpSpec,
    MeshSpec,
    RegistrySpec,
    check_etcd_url,
    check_listen,
    check_relay_url,
    check_watch,
    load_spec,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEFAULT_STATE_DIR = Path("/var/lib/vnetd")
DEFAULT_RESYNC_INTERVAL = 30.0
DEFAULT_WIREGUARD_DIR = Path(UPSTREAM_SOCKET_DIR)
ENV_PASSWORD = "VNETD_ETCD_PASSWORD"
ENV_RELAYS = "VNETD_RELAYS"

# RegistrySpec field -> (flag, environment variable)
_ACCESS: dict[str, tuple[str, str]] = {
    "ca_file": ("--etcd-ca", "VNETD_ETCD_CA"),
    "cert_file": ("--etcd-cert", "VNETD_ETCD_CERT"),
    "key_file": ("--etcd-key", "VNETD_ETCD_KEY"),
    "username": ("--etcd-user", "VNETD_ETCD_USER"),
    "password_file": ("--etcd-password-file", "VNETD_ETCD_PASSWORD_FILE"),
    "watch": ("--etcd-watch", "VNETD_ETCD_WATCH"),
}
_FILES = ("ca_file", "cert_file", "key_file", "password_file")


AccessFlags = Mapping[str, str | None]
"""The etcd access flags as given, by ``[registry]`` key (absent or None: not given)."""
NO_ACCESS_FLAGS: AccessFlags = MappingProxyType({})


@dataclass(frozen=True)
class Settings:
    """``vnetd up``'s flags as given, beside the spec they resolved.

    ``vnetd.daemon_settings.resolve_daemon_settings`` resolves them with the
    environment and the host's facts into ``DaemonSettings``, what the daemon
    runs with (``--rank auto`` waits for the registry; the data plane kind is
    chosen with the host's WireGuard).
    """

    spec: MeshSpec
    rank: str | None = None
    """``--rank``: a rank or ``auto``; None: VNETD_RANK, JOB_COMPLETION_INDEX, hostname."""
    endpoint: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    instance: str | None = None
    dataplane: str | None = None
    """auto, kernel, userspace or fake; None: the spec's [wireguard] dataplane (auto)."""
    resync_interval: float = DEFAULT_RESYNC_INTERVAL
    preshared_key_file: str | None = None
    signing_key_file: str | None = None
    """``--signing-key-file``; None: VNETD_SIGNING_KEY_FILE, ``[wireguard]
    signing_key_file``, else ``signing.key`` in the state dir."""
    rank_cert_file: str | None = None
    """``--rank-cert-file``; None: VNETD_RANK_CERT_FILE, ``[wireguard] rank_cert_file``,
    else none."""
    site: str | None = None
    """``--site``; None: VNETD_SITE, then ``[site] name``."""
    public_endpoint: str | None = None
    """``--public-endpoint``; None: VNETD_PUBLIC_ENDPOINT, then ``[site] public_endpoint``."""
    public_endpoint_file: Path | None = None
    """``--public-endpoint-file``: the public endpoint's only source, followed while running."""
    exit_on_file: Path | None = None
    """``--exit-on-file``; None: VNETD_EXIT_ON_FILE, else run until a signal."""


Record = TypeVar("Record", bound="DataclassInstance")


def settings_from_args(
    record: type[Record], args: argparse.Namespace, env: Mapping[str, str]
) -> Record:
    """A command's settings ``record`` from its parsed command line, in one step.

    Its ``spec`` field is ``spec_from_args``; every other field is the value
    of the flag of the same name.

    Raises:
        VnetdError: naming the spec key, flag or variable at fault (exit 2).
    """
    given = {
        field.name: getattr(args, field.name) for field in fields(record) if field.name != "spec"
    }
    build: Callable[..., Record] = record
    return build(spec=spec_from_args(args, env), **given)


def spec_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> MeshSpec:
    """The spec of a command that reaches the registry (it has the etcd flags),
    with ``--http-listen`` applied where the command has it."""
    return resolve_spec(
        args.config,
        env,
        etcd=args.etcd,
        relays=relays_given(args, env),
        access=etcd_access(args),
        http_listen=getattr(args, "http_listen", None),
    )


def resolve_spec(
    config: Path,
    env: Mapping[str, str],
    *,
    etcd: Sequence[str] = (),
    relays: Sequence[str] = (),
    access: AccessFlags = NO_ACCESS_FLAGS,
    http_listen: str | None = None,
) -> MeshSpec:
    """The spec file with the etcd URLs, the relay URLs, the etcd access settings and the
    HTTP listen address applied, in that order."""
    spec = with_relays(with_etcd_endpoints(load_spec(config), etcd), relays)
    spec = with_etcd_access(spec, access, env)
    return with_http_listen(spec, http_listen)


def add_etcd_arguments(parser: argparse.ArgumentParser, *, relays: bool = True) -> None:
    """Add ``--etcd URL`` (repeatable), ``--relay URL`` (unless ``relays`` is False: a
    command that reads no members, or a relay itself) and the TLS and auth flags."""
    parser.add_argument(
        "--etcd",
        action="append",
        default=[],
        metavar="URL",
        help="etcd client URL; repeat for several (overrides registry.endpoints)",
    )
    if relays:
        parser.add_argument(
            "--relay",
            action="append",
            default=[],
            metavar="URL",
            help=f"read the members through this vnetd relay, then etcd; repeat for several "
            f"(else {ENV_RELAYS}, comma-separated, else registry.relays)",
        )
    group = parser.add_argument_group("etcd TLS and auth (else env, else [registry])")
    group.add_argument(
        "--etcd-ca", metavar="FILE", help="PEM CA of etcd's certificate (env VNETD_ETCD_CA)"
    )
    group.add_argument(
        "--etcd-cert", metavar="FILE", help="PEM client certificate (env VNETD_ETCD_CERT)"
    )
    group.add_argument(
        "--etcd-key", metavar="FILE", help="PEM client certificate key (env VNETD_ETCD_KEY)"
    )
    group.add_argument("--etcd-user", metavar="NAME", help="etcd user (env VNETD_ETCD_USER)")
    group.add_argument(
        "--etcd-password-file",
        metavar="FILE",
        help="file holding the etcd user's password "
        "(env VNETD_ETCD_PASSWORD_FILE, or the password itself in VNETD_ETCD_PASSWORD)",
    )
    group.add_argument(
        "--etcd-watch",
        choices=WATCH_TRANSPORTS,
        help="how the member watch reaches etcd: json (its JSON gateway, the default) or "
        "grpc (native gRPC; see registry.watch_endpoints) (env VNETD_ETCD_WATCH)",
    )


def add_site_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--site`` and ``--public-endpoint`` (docs/architecture.md, "Sites")."""
    parser.add_argument(
        "--site",
        metavar="NAME",
        help="the site this member is in (else VNETD_SITE, else [site] name, else default)",
    )
    parser.add_argument(
        "--public-endpoint",
        metavar="HOST:PORT",
        help="where other sites reach this member, e.g. a port its NAT forwards "
        "(else VNETD_PUBLIC_ENDPOINT, else [site] public_endpoint; none by default)",
    )


def add_public_endpoint_file_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--public-endpoint-file`` (docs/architecture.md, "Sites": a NAT mapping
    that changes)."""
    parser.add_argument(
        "--public-endpoint-file",
        type=Path,
        metavar="FILE",
        help="read the public endpoint from FILE (empty: none) and register it again "
        "whenever it changes, e.g. when the NAT forwards another port",
    )


def add_exit_on_file_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--exit-on-file``: end cleanly when a launcher marks its job done."""
    parser.add_argument(
        "--exit-on-file",
        type=Path,
        metavar="FILE",
        help="exit 0, releasing the rank at once, when FILE exists, e.g. the marker a "
        "launcher writes when its job ends (else VNETD_EXIT_ON_FILE; default: run until "
        "SIGTERM)",
    )


def add_wireguard_dir_argument(parser: argparse.ArgumentParser, tail: str) -> None:
    """Add ``--wireguard-dir``: where wireguard-go's sockets are (``tail`` ends the help)."""
    parser.add_argument(
        "--wireguard-dir",
        type=Path,
        default=DEFAULT_WIREGUARD_DIR,
        metavar="DIR",
        help=f"where wireguard-go's <interface>.sock lives, shared with vnetd{tail}",
    )


def etcd_access(args: argparse.Namespace) -> AccessFlags:
    """The access flags of a parsed command line (from ``add_etcd_arguments``)."""
    return {name: getattr(args, _dest(flag)) for name, (flag, _variable) in _ACCESS.items()}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def with_etcd_endpoints(spec: MeshSpec, urls: Sequence[str]) -> MeshSpec:
    """``spec`` with its etcd endpoints replaced by ``--etcd`` URLs (if any were given)."""
    if not urls:
        return spec
    checked = tuple(check_etcd_url(url) for url in urls)
    return replace(spec, registry=replace(spec.registry, endpoints=checked))


def relays_given(args: argparse.Namespace, env: Mapping[str, str]) -> list[str]:
    """``--relay`` URLs, else ``VNETD_RELAYS`` (comma-separated), else none (and none
    for a command without ``--relay``)."""
    if not hasattr(args, "relay"):
        return []
    given = list(args.relay)
    if given:
        return given
    return [url.strip() for url in env.get(ENV_RELAYS, "").split(",") if url.strip()]


def with_relays(spec: MeshSpec, urls: Sequence[str]) -> MeshSpec:
    """``spec`` with its relays replaced by ``urls`` (if any were given)."""
    if not urls:
        return spec
    checked = tuple(check_relay_url(url, key=f"--relay ({ENV_RELAYS})") for url in urls)
    return replace(spec, registry=replace(spec.registry, relays=checked))


def with_http_listen(spec: MeshSpec, listen: str | None) -> MeshSpec:
    """``spec`` with the HTTP endpoint's listen address replaced by ``--http-listen``."""
    if listen is None:
        return spec
    return replace(spec, http=HttpSpec(listen=check_listen(listen)))


def with_etcd_access(spec: MeshSpec, access: AccessFlags, env: Mapping[str, str]) -> MeshSpec:
    """``spec`` with its ``[registry]`` access settings overridden by flags, then env,
    and the password read (``registry_access``)."""
    return replace(spec, registry=registry_access(spec.registry, access, env))


def registry_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> RegistrySpec:
    """The registry settings of a command given no spec (``vnetd provision
    --enable-auth``): ``--etcd`` URLs, then the access flags and environment.

    Raises:
        SpecError: no ``--etcd`` URL, or what ``registry_access`` raises.
    """
    if not args.etcd:
        raise SpecError("--etcd: give etcd's client URL (without --config no spec names one)")
    endpoints = tuple(check_etcd_url(url) for url in args.etcd)
    return registry_access(RegistrySpec(endpoints=endpoints), etcd_access(args), env)


def registry_access(
    registry: RegistrySpec, access: AccessFlags, env: Mapping[str, str]
) -> RegistrySpec:
    """``registry``'s access settings overridden by flags, then env, and the password read.

    Raises:
        SpecError: a file is missing or unreadable, a user has no password (or
            a password no user), a certificate has no key, or TLS files are
            given for http:// endpoints; the message names the flag.
    """
    values: dict[str, str | None] = {}
    for name, (_flag, variable) in _ACCESS.items():
        value = access.get(name) or env.get(variable) or getattr(registry, name)
        values[name] = value or None
    check_watch(values["watch"], _where("watch"))
    registry = replace(registry, **values)  # type: ignore[arg-type]
    _check_files(registry)
    password = _password(registry, env)
    _check_combination(registry, password)
    return replace(registry, password=password)


def _where(name: str) -> str:
    flag, variable = _ACCESS[name]
    return f"{flag} ({variable}, registry.{name})"


def _check_files(registry: RegistrySpec) -> None:
    for name in _FILES:
        value = getattr(registry, name)
        if value is None:
            continue
        path = Path(value)
        if not path.is_file():
            raise SpecError(f"{_where(name)}: {value}: no such file")
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise SpecError(f"{_where(name)}: {value}: cannot read: {exc.strerror}") from None


def _password(registry: RegistrySpec, env: Mapping[str, str]) -> str | None:
    if registry.password_file is not None:
        text = Path(registry.password_file).read_text(errors="replace").rstrip("\r\n")
        if not text:
            raise SpecError(f"{_where('password_file')}: {registry.password_file} is empty")
        return text
    return env.get(ENV_PASSWORD) or None


def _check_combination(registry: RegistrySpec, password: str | None) -> None:
    if registry.username is not None and password is None:
        raise SpecError(
            f"{_where('username')}: user {registry.username!r} has no password; give "
            f"--etcd-password-file FILE or set {ENV_PASSWORD}"
        )
    if registry.username is None and password is not None:
        raise SpecError(f"{_where('username')}: a password is given but no etcd user")
    if (registry.cert_file is None) != (registry.key_file is None):
        raise SpecError(f"{_where('cert_file')} and {_where('key_file')}: give both or neither")
    tls_files = registry.ca_file or registry.cert_file
    plain = [url for url in registry.endpoints if not url.startswith("https://")]
    if tls_files and plain:
        raise SpecError(
            f"{_where('ca_file' if registry.ca_file else 'cert_file')}: TLS files are given "
            f"but the etcd URL {plain[0]} is http://; use https:// URLs"
        )
