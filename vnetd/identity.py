"""Who a member is: its rank, endpoint, instance, site, public endpoint and signing key file.

Each is resolved here and nowhere else, from a flag, the environment, the spec
and what the host said (its hostname, the default route's address), which the
caller reads and hands in as plain values; so this module reads no host and no
environment of its own, and ``vnetd up`` (``vnetd.daemon_settings``) and
``vnetd register`` share every rule. See the module map in docs/architecture.md.

Rank order: ``--rank``, ``VNETD_RANK``, ``JOB_COMPLETION_INDEX`` (Kubernetes
Indexed Jobs), then the hostname parsed with the spec's pattern; ``auto`` (flag,
else ``VNETD_RANK``) leaves it to the registry. Endpoint order: ``--endpoint``,
``POD_IP`` with the spec's port, then the address of the interface holding the
default route. The key pair is ``vnetd.keys``'s.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Literal

from vnetd.errors import IdentityError
from vnetd.model import check_endpoint
from vnetd.spec import MeshSpec, check_site_name

AUTO: Literal["auto"] = "auto"
"""The rank the registry assigns (``--rank auto``)."""
ENV_RANK = "VNETD_RANK"
ENV_POD_IP = "POD_IP"
ENV_SIGNING_KEY_FILE = "VNETD_SIGNING_KEY_FILE"
ENV_RANK_CERT_FILE = "VNETD_RANK_CERT_FILE"
RANK_CERT_FILE_MAX = 64 * 1024
"""Largest rank certificate file read (a PEM chain of a few certificates)."""


def _rank_sources(flag: str | None, env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    return [
        ("--rank", flag),
        (ENV_RANK, env.get(ENV_RANK)),
        ("JOB_COMPLETION_INDEX", env.get("JOB_COMPLETION_INDEX")),
    ]


def rank_given(flag: str | None, env: Mapping[str, str]) -> bool:
    """Whether the flag or a variable gives a rank at all (good or bad)."""
    return any(value for _, value in _rank_sources(flag, env))  # "" counts as not given


def wants_auto_rank(flag: str | None, env: Mapping[str, str]) -> bool:
    """``--rank auto`` (or ``VNETD_RANK=auto`` without a flag): the registry assigns it."""
    (_, given), (_, variable), _ = _rank_sources(flag, env)
    value = given if given is not None else variable
    return value is not None and value.strip().lower() == AUTO


def resolve_rank_or_auto(
    spec: MeshSpec, flag: str | None, env: Mapping[str, str], hostname: str
) -> int | Literal["auto"]:
    """``AUTO`` when the registry is to assign the rank (``wants_auto_rank``), else
    ``resolve_rank``'s."""
    return AUTO if wants_auto_rank(flag, env) else resolve_rank(spec, flag, env, hostname)


def resolve_rank(spec: MeshSpec, flag: str | None, env: Mapping[str, str], hostname: str) -> int:
    """The rank from the first source that gives one.

    Raises:
        IdentityError: no source gives a rank, or it is not an integer in range.
    """
    for name, value in _rank_sources(flag, env):
        if value is None or value == "":
            continue
        value = value.strip()
        if not value.isdigit():
            raise IdentityError(f"{name}: {value!r} is not a rank (a non-negative integer)")
        rank = int(value)
        if rank >= spec.size:
            raise IdentityError(
                f"{name}: rank {rank} is out of range: mesh {spec.name!r} has ranks "
                f"0..{spec.size - 1}"
            )
        return rank
    from_host = spec.rank_of_host(hostname)
    if from_host is None:
        example = spec.host(0)
        raise IdentityError(
            "no rank: give --rank, or set VNETD_RANK or JOB_COMPLETION_INDEX, or run on a "
            f"host named like {example!r} (this host is {hostname!r})"
        )
    return from_host


def resolve_instance(flag: str | None, env: Mapping[str, str], hostname: str) -> str:
    """The pod name that owns the claim: ``--instance``, ``POD_NAME``, else the hostname."""
    return flag or env.get("POD_NAME") or hostname


def needs_default_route(flag: str | None, env: Mapping[str, str]) -> bool:
    """Whether the endpoint comes from the default route: neither ``--endpoint`` nor
    ``POD_IP`` gives it (the caller then reads the route, and only then)."""
    return not flag and not env.get(ENV_POD_IP)


def resolve_endpoint(
    spec: MeshSpec, flag: str | None, env: Mapping[str, str], default_route_ip: str | None
) -> str:
    """The underlay ``ip:port`` that peers should send to.

    Args:
        default_route_ip: the address of the default-route interface, looked
            up by the caller (``link.default_route_address``) when
            ``needs_default_route``, or None.
    """
    if flag:
        try:
            return check_endpoint(flag)
        except ValueError as exc:
            raise IdentityError(f"--endpoint: {exc}") from None
    pod_ip = env.get(ENV_POD_IP)
    if pod_ip:
        return _join(pod_ip, spec.port, ENV_POD_IP)
    if default_route_ip:
        return _join(default_route_ip, spec.port, "default route")
    raise IdentityError(
        "no endpoint: give --endpoint HOST:PORT or set POD_IP; this host has no default route"
    )


def _join(host: str, port: int, source: str) -> str:
    try:
        addr = ip_address(host.strip())
    except ValueError:
        raise IdentityError(f"{source}: {host!r} is not an IP address") from None
    joined = f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
    try:
        return check_endpoint(joined)  # the rules every peer applies to our entry
    except ValueError as exc:
        raise IdentityError(f"{source}: {host!r}: {exc}") from None


def resolve_site(spec: MeshSpec, flag: str | None, env: Mapping[str, str]) -> str:
    """This member's site: ``--site``, ``VNETD_SITE``, ``[site] name`` (else ``default``).

    Raises:
        SpecError: not a DNS label; the message names the flag or variable.
    """
    for source, value in (("--site", flag), ("VNETD_SITE", env.get("VNETD_SITE"))):
        if value:
            return check_site_name(value.strip(), source)
    return spec.site.name


def resolve_public_endpoint(
    spec: MeshSpec, flag: str | None, env: Mapping[str, str], file: Path | None = None
) -> str | None:
    """The ``ip:port`` other sites reach this member at, or None (no forwarded port).

    ``file`` (``--public-endpoint-file``), when given, is the only source: its
    content (empty: none), which the daemon then follows.
    """
    sources = [
        ("--public-endpoint", flag),
        ("VNETD_PUBLIC_ENDPOINT", env.get("VNETD_PUBLIC_ENDPOINT")),
        ("site.public_endpoint", spec.site.public_endpoint),
    ]
    if file is not None:
        try:
            sources = [(f"--public-endpoint-file {file}", file.read_text())]
        except OSError as exc:
            raise IdentityError(f"--public-endpoint-file {file}: {exc.strerror}") from None
    for source, value in sources:
        if value and value.strip():
            try:
                return check_endpoint(value.strip())
            except ValueError as exc:
                raise IdentityError(f"{source}: {exc}") from None
    return None


def named_file(
    flag: tuple[str, str | None],
    variable: str,
    env: Mapping[str, str],
    spec_key: tuple[str, str | None],
) -> tuple[str, Path] | None:
    """The file the first source names, flag, then environment ``variable``, then spec
    key (each a ``(name, value)``; an empty value names none), and that source's name
    for messages; None: none names one."""
    sources = (flag, (variable, env.get(variable)), spec_key)
    return next(((source, Path(value)) for source, value in sources if value), None)


def resolve_signing_key_file(
    flag: str | None, env: Mapping[str, str], spec: MeshSpec
) -> tuple[str, Path] | None:
    """The record signing key's file and what named it: ``--signing-key-file``,
    ``VNETD_SIGNING_KEY_FILE``, then ``[wireguard] signing_key_file``; None: the
    state dir's ``signing.key``. The file is read by ``control.proof.open_signer``."""
    return named_file(("--signing-key-file", flag), ENV_SIGNING_KEY_FILE, env,
                      ("wireguard.signing_key_file", spec.local.signing_key_file))  # fmt: skip


@dataclass(frozen=True)
class RankCertFile:
    """The rank certificate every record carries, as read at start."""

    named: str
    """What named the file, and the file (``--rank-cert-file FILE``), for messages."""
    path: Path
    cert: str
    """Base64 DER."""


def resolve_rank_cert(
    flag: str | None, env: Mapping[str, str], spec: MeshSpec
) -> RankCertFile | None:
    """The rank certificate this member's records carry: the file ``--rank-cert-file``,
    ``VNETD_RANK_CERT_FILE``, then ``[wireguard] rank_cert_file`` names, read once
    (``read_rank_cert``); None: no file named.

    Raises:
        IdentityError: the file cannot be read or holds no certificate.
    """
    named = named_file(("--rank-cert-file", flag), ENV_RANK_CERT_FILE, env,
                       ("wireguard.rank_cert_file", spec.local.rank_cert_file))  # fmt: skip
    if named is None:
        return None
    source, path = named
    try:
        return RankCertFile(f"{source} {path}", path, read_rank_cert(path))
    except OSError as exc:
        raise IdentityError(f"{source} {path}: cannot read the rank certificate: "
                            f"{exc.strerror}") from None  # fmt: skip
    except ValueError as exc:
        raise IdentityError(f"{source} {path}: {exc}") from None


def read_rank_cert(path: Path) -> str:
    """The certificate in ``path`` as base64 DER: the file DER, or PEM (its first
    certificate: the csi-driver's ``tls.crt``); what it holds is checked by
    ``control.rank_cert``, which names the fault.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is empty, too large, or PEM without a certificate.
    """
    with path.open("rb") as file:
        data = file.read(RANK_CERT_FILE_MAX + 1)
    if len(data) > RANK_CERT_FILE_MAX or not data.strip():
        raise ValueError(f"empty or over {RANK_CERT_FILE_MAX} bytes; name the rank "
                         "certificate (DER or PEM)")  # fmt: skip
    if b"-----BEGIN" not in data:
        return base64.b64encode(data).decode()
    match = _PEM_CERT.search(data)
    try:
        der = base64.b64decode(b"".join(match.group(1).split()), validate=True) if match else b""
    except (binascii.Error, ValueError):
        der = b""
    if not der:
        raise ValueError("PEM without a CERTIFICATE block; name the rank certificate")
    return base64.b64encode(der).decode()


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\s]+)-----END CERTIFICATE-----")
