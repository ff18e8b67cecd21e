"""How every command reaches etcd: URLs, TLS files and a user, from flags, env or spec.

One place for the flags (``add_etcd_arguments``), their precedence (flag,
then environment, then the spec's ``[registry]`` table) and the opener that
builds the client (``open_registry_for``), so ``vnetd up``, ``wait``,
``status`` and ``render wg-quick`` accept the same options. Secrets come from
files (or ``VNETD_ETCD_PASSWORD``), never from a flag's value.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from vnetd.errors import SpecError
from vnetd.spec import MeshSpec, RegistrySpec

if TYPE_CHECKING:  # the CLI builds its parsers without importing httpx
    from vnetd.registry.base import Registry
    from vnetd.registry.etcd import EtcdRegistry, EtcdSecurity

ENV_PASSWORD = "VNETD_ETCD_PASSWORD"

# RegistrySpec field -> (flag, environment variable)
_SETTINGS: dict[str, tuple[str, str]] = {
    "ca_file": ("--etcd-ca", "VNETD_ETCD_CA"),
    "cert_file": ("--etcd-cert", "VNETD_ETCD_CERT"),
    "key_file": ("--etcd-key", "VNETD_ETCD_KEY"),
    "username": ("--etcd-user", "VNETD_ETCD_USER"),
    "password_file": ("--etcd-password-file", "VNETD_ETCD_PASSWORD_FILE"),
}
_FILES = ("ca_file", "cert_file", "key_file", "password_file")


@dataclass(frozen=True)
class EtcdAccess:
    """The access flags as given (None: not given)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password_file: str | None = None


NO_ACCESS_FLAGS = EtcdAccess()


def add_etcd_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--etcd URL`` (repeatable) and the TLS and auth flags to ``parser``."""
    parser.add_argument(
        "--etcd",
        action="append",
        default=[],
        metavar="URL",
        help="etcd client URL; repeat for several (overrides registry.endpoints)",
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


def etcd_access(args: argparse.Namespace) -> EtcdAccess:
    """The access flags of a parsed command line."""
    return EtcdAccess(
        ca_file=args.etcd_ca,
        cert_file=args.etcd_cert,
        key_file=args.etcd_key,
        username=args.etcd_user,
        password_file=args.etcd_password_file,
    )


def with_etcd_access(spec: MeshSpec, access: EtcdAccess, env: Mapping[str, str]) -> MeshSpec:
    """``spec`` with its ``[registry]`` access settings overridden by flags, then env,
    and the password read.

    Raises:
        SpecError: a file is missing or unreadable, a user has no password (or
            a password no user), a certificate has no key, or TLS files are
            given for http:// endpoints; the message names the flag.
    """
    registry = spec.registry
    values: dict[str, str | None] = {}
    for name, (_flag, variable) in _SETTINGS.items():
        value = getattr(access, name) or env.get(variable) or getattr(registry, name)
        values[name] = value or None
    registry = replace(registry, **values)  # type: ignore[arg-type]
    _check_files(registry)
    password = _password(registry, env)
    _check_combination(registry, password)
    return replace(spec, registry=replace(registry, password=password))


def _where(name: str) -> str:
    flag, variable = _SETTINGS[name]
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


def security_of(registry: RegistrySpec) -> EtcdSecurity:
    """The client's TLS files and credentials from resolved ``[registry]`` settings."""
    from vnetd.registry.etcd import EtcdSecurity

    return EtcdSecurity(
        ca_file=Path(registry.ca_file) if registry.ca_file else None,
        cert_file=Path(registry.cert_file) if registry.cert_file else None,
        key_file=Path(registry.key_file) if registry.key_file else None,
        username=registry.username,
        password=registry.password,
    )


def open_registry_for(spec: MeshSpec) -> AbstractAsyncContextManager[EtcdRegistry]:
    """An etcd client for ``spec``'s registry settings (after ``with_etcd_access``)."""
    from vnetd.registry.etcd import open_etcd_registry

    return open_etcd_registry(
        spec.registry.endpoints, security_of(spec.registry), lease_ttl=spec.registry.lease_ttl
    )


def secured_opener(
    spec: MeshSpec,
) -> Callable[[Sequence[str]], AbstractAsyncContextManager[Registry]]:
    """An opener of etcd at given endpoints with ``spec``'s TLS and auth settings."""
    from vnetd.registry.etcd import open_etcd_registry

    security = security_of(spec.registry)

    def open_registry(endpoints: Sequence[str]) -> AbstractAsyncContextManager[Registry]:
        return open_etcd_registry(endpoints, security)

    return open_registry
