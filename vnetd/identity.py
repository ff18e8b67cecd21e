"""Who this daemon is: its rank, its key, its endpoint and its instance name.

Rank order: ``--rank``, ``VNETD_RANK``, ``JOB_COMPLETION_INDEX`` (Kubernetes
Indexed Jobs), then the hostname parsed with the spec's pattern.
Endpoint order: ``--endpoint``, ``POD_IP`` with the spec's port, then the
address of the interface holding the default route. Site and public endpoint
(docs/architecture.md, "Sites"): ``config.resolve_site``;
``--public-endpoint``, ``VNETD_PUBLIC_ENDPOINT``, ``[site] public_endpoint``.
The private key is X25519, generated once into the state dir (0600 in a
0700 directory) and reused; it is never logged or registered. Beside it, an
Ed25519 signing key (``signing.key``, same rules) signs the member records
(``control.proof``; docs/architecture.md, "Registry layout").
"""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from vnetd.control.membership import check_endpoint
from vnetd.control.proof import Signer
from vnetd.errors import IdentityError
from vnetd.spec import MeshSpec

KEY_FILE = "private.key"
SIGNING_KEY_FILE = "signing.key"


@dataclass(frozen=True)
class KeyPair:
    private_key: str
    public_key: str

    def __repr__(self) -> str:  # the private key never reaches a log
        return f"KeyPair(public_key={self.public_key!r})"


def resolve_rank(spec: MeshSpec, flag: str | None, env: Mapping[str, str], hostname: str) -> int:
    """The rank from the first source that gives one.

    Raises:
        IdentityError: no source gives a rank, or it is not an integer in range.
    """
    sources = [
        ("--rank", flag),
        ("VNETD_RANK", env.get("VNETD_RANK")),
        ("JOB_COMPLETION_INDEX", env.get("JOB_COMPLETION_INDEX")),
    ]
    for name, value in sources:
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


def resolve_instance(flag: str | None, env: Mapping[str, str]) -> str:
    """The pod name that owns the claim: ``--instance``, ``POD_NAME``, else the hostname."""
    return flag or env.get("POD_NAME") or socket.gethostname()


def resolve_endpoint(
    spec: MeshSpec, flag: str | None, env: Mapping[str, str], default_route_ip: str | None
) -> str:
    """The underlay ``ip:port`` that peers should send to.

    Args:
        default_route_ip: the address of the default-route interface, looked
            up by the caller (``link.default_route_address``), or None.
    """
    if flag:
        try:
            return check_endpoint(flag)
        except ValueError as exc:
            raise IdentityError(f"--endpoint: {exc}") from None
    pod_ip = env.get("POD_IP")
    if pod_ip:
        return _join(pod_ip, spec.port, "POD_IP")
    if default_route_ip:
        return _join(default_route_ip, spec.port, "default route")
    raise IdentityError(
        "no endpoint: give --endpoint HOST:PORT or set POD_IP; this host has no default route"
    )


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


def load_or_create_key(state_dir: Path) -> KeyPair:
    """The key pair in ``state_dir``, generating it on first use.

    Raises:
        IdentityError: the directory or key file is unusable.
    """
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise IdentityError(f"--state-dir {state_dir}: cannot create: {exc.strerror}") from None
    path = state_dir / KEY_FILE
    if path.exists():
        return _read_key(path)
    key = X25519PrivateKey.generate()
    encoded = base64.b64encode(key.private_bytes_raw()).decode()
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(encoded + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise IdentityError(f"{path}: cannot write the key: {exc.strerror}") from None
    return KeyPair(encoded, public_key_of(encoded))


def load_or_create_signer(state_dir: Path) -> Signer:
    """The record signing key in ``state_dir`` (``signing.key``), generated on first use.

    Raises:
        IdentityError: the directory or key file is unusable.
    """
    path = state_dir / SIGNING_KEY_FILE
    if path.exists():
        text = _private_text(path, "signing key")
        try:
            return Signer.from_private_bytes(base64.b64decode(text, validate=True))
        except ValueError:
            raise IdentityError(f"{path}: not a base64 Ed25519 private key") from None
    signer = Signer.generate()
    _write_private(path, base64.b64encode(signer.private_bytes()).decode(), "signing key")
    return signer


def _write_private(path: Path, encoded: str, what: str) -> None:
    """Write a private key file (0600), replacing it atomically."""
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(encoded + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise IdentityError(f"{path}: cannot write the {what}: {exc.strerror}") from None


def _private_text(path: Path, what: str) -> str:
    """A private key file's text; refused when others may read it."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise IdentityError(
            f"{path}: mode {mode:04o} lets others read the {what}; run chmod 600 {path}"
        )
    return path.read_text().strip()


def _read_key(path: Path) -> KeyPair:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise IdentityError(
            f"{path}: mode {mode:04o} lets others read the private key; run chmod 600 {path}"
        )
    text = path.read_text().strip()
    try:
        return KeyPair(text, public_key_of(text))
    except ValueError:
        raise IdentityError(f"{path}: not a base64 X25519 private key") from None


def load_preshared_key(path: Path, source: str = "--preshared-key-file") -> str:
    """The mesh-wide pre-shared key (base64 of 32 bytes, ``wg genpsk``) from ``path``.

    Raises:
        IdentityError: unreadable, readable by group or others, or not a key;
            the key itself is never part of the message.
    """
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text().strip()
    except OSError as exc:
        raise IdentityError(f"{source} {path}: cannot read: {exc.strerror}") from None
    if mode & 0o077:
        raise IdentityError(
            f"{source} {path}: mode {mode:04o} lets others read the pre-shared key; "
            f"run chmod 600 {path}"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise IdentityError(f"{source} {path}: not a base64 32-byte key (make one with wg genpsk)")
    return text


def public_key_of(private_key: str) -> str:
    """The base64 public key of a base64 X25519 private key."""
    raw = base64.b64decode(private_key, validate=True)
    if len(raw) != 32:
        raise ValueError("an X25519 private key is 32 bytes")
    public = X25519PrivateKey.from_private_bytes(raw).public_key()
    return base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
