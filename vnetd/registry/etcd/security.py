"""How ``EtcdRegistry`` reaches a secured etcd, and what it says when that fails.

TLS with a CA file and a client certificate, and etcd's username/password
auth (the token of each member is kept by ``tokens``). Credential problems (a
certificate that does not verify, a wrong password, a permission denied)
raise ``RegistryAccessError``, one line that names the flag to fix. It is a
``RegistryUnavailable``: the daemon keeps its data plane and retries (a
certificate may be renewed, a role granted), the CLI prints the line and
exits 2.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.spec import RegistrySpec


class RegistryAccessError(RegistryUnavailable):
    """etcd refused our credentials: TLS verification, authentication or a permission."""


class AuthRequired(RegistryAccessError):
    """etcd's auth is on and the call named no user ("user name is empty")."""


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach a secured etcd: TLS files and a user. The password is never shown."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The client's TLS context: the CA (else the system's) and our certificate.

        Raises:
            RegistryError: a file cannot be read or is not PEM of the right kind.
        """
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(
                f"--etcd-ca (registry.ca_file) {self.ca_file}: not a readable PEM CA "
                f"certificate: {_reason(exc)}"
            ) from None
        if self.cert_file or self.key_file:
            if not (self.cert_file and self.key_file):
                raise RegistryError(
                    "--etcd-cert and --etcd-key (registry.cert_file, registry.key_file): "
                    "give both or neither"
                )
            _check_not_expired(self.cert_file)
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except (OSError, ssl.SSLError) as exc:
                raise RegistryError(
                    f"--etcd-cert {self.cert_file} / --etcd-key {self.key_file}: cannot load "
                    f"the client certificate and key: {_reason(exc)}"
                ) from None
        return context


class SharedTls:
    """The TLS contexts of every registry client one process opens, built once each.

    A context costs its CA bundle and certificate loads (~20 ms of CPU with the
    system's bundle; even httpx's unverified one for plain http costs ~5 ms), a
    shared one 0.1 ms per client: what a process running many daemons (the
    control-plane bench's simulated ranks) pays per client otherwise. Files are
    read when a context is first asked for, so a certificate renewed on disk is
    seen by the next process, not by a client opened later in this one.
    """

    def __init__(self) -> None:
        self._contexts: dict[EtcdSecurity | None, ssl.SSLContext] = {}

    def context(self, security: EtcdSecurity, tls: bool) -> ssl.SSLContext:
        """The context for clients with ``security``; ``tls`` False (plain http
        endpoints): one context that is never used for a handshake."""
        key = security if tls else None
        found = self._contexts.get(key)
        if found is None:
            found = security.ssl_context() if tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            self._contexts[key] = found
        return found


def _check_not_expired(cert_file: Path) -> None:
    """Refuse a client certificate that is expired or not yet valid: etcd would only
    close the connection (TLS 1.3 reports it after the handshake), with no reason."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return  # load_cert_chain names the problem
    now = datetime.now(UTC)
    if now > cert.not_valid_after_utc:
        raise RegistryAccessError(
            f"--etcd-cert (registry.cert_file) {cert_file}: the client certificate expired "
            f"on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it"
        )
    if now < cert.not_valid_before_utc:
        raise RegistryAccessError(
            f"--etcd-cert (registry.cert_file) {cert_file}: the client certificate is not "
            f"valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC; check the clock"
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason)
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def tls_problem(exc: BaseException, endpoint: str) -> RegistryAccessError | None:
    """A one-line ``RegistryAccessError`` if ``exc`` (or its cause) is a TLS failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            why = str(seen.verify_message or seen.reason)
            fix = (
                "renew etcd's server certificate"
                if "expired" in why
                else "check --etcd-ca (registry.ca_file): it must be the CA that signed "
                "etcd's certificate, for this host name"
            )
            return RegistryAccessError(f"etcd {endpoint}: certificate verify failed ({why}); {fix}")
        if isinstance(seen, ssl.SSLError):
            why = str(seen.reason or seen)
            if "EXPIRED" in why.upper():
                fix = "renew the client certificate (--etcd-cert, registry.cert_file)"
            else:
                fix = "check --etcd-cert/--etcd-key and that etcd trusts their CA"
            return RegistryAccessError(f"etcd {endpoint}: TLS handshake refused ({why}); {fix}")
        seen = seen.__cause__ or seen.__context__
    return None


def closed_hint(exc: BaseException, endpoint: str) -> str:
    """What a bare closed connection on https most likely means (etcd does not say)."""
    if endpoint.startswith("https://") and isinstance(exc, httpx.ReadError) and not str(exc):
        return (
            " (connection closed after the TLS handshake: etcd may have refused the client "
            "certificate; check --etcd-cert/--etcd-key and that etcd trusts their CA)"
        )
    return ""


def security_of(settings: RegistrySpec) -> EtcdSecurity:
    """The client's TLS files and credentials from resolved ``[registry]`` settings."""
    return EtcdSecurity(
        ca_file=Path(settings.ca_file) if settings.ca_file else None,
        cert_file=Path(settings.cert_file) if settings.cert_file else None,
        key_file=Path(settings.key_file) if settings.key_file else None,
        username=settings.username,
        password=settings.password,
    )
