"""A relay's TLS: its certificate and key in one server context, loaded again when the
files change.

cert-manager renews a certificate into the same Secret, and the kubelet swaps the
mounted files in place, so a relay looks at them every ``RELOAD_EVERY`` s and loads
the new pair into the context it serves with: the handshakes after that present the
renewed certificate, without a restart or a dropped watch. A pair that does not load
(caught half-written, say) is logged and tried again at the next look; the loaded one
stays until then.

The context offers HTTP/1.1 only (the daemons' httpx speaks nothing else) and asks no
client certificate: a relay serves reads of signed records to whoever reaches it
(docs/architecture.md, "Relay").
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import trio

from vnetd.errors import SpecError

log = logging.getLogger("vnetd.relay")

RELOAD_EVERY = 60.0
"""Seconds between two looks at the certificate's and key's files."""


@dataclass(frozen=True)
class RelayTls:
    """The PEM files a relay serves HTTPS with."""

    cert_file: Path
    key_file: Path


def server_context(tls: RelayTls) -> ssl.SSLContext:
    """A server context holding ``tls``'s pair.

    Raises:
        SpecError: a file cannot be read, or the pair is not a PEM certificate and
            its key (one line, naming the flag).
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.set_alpn_protocols(["http/1.1"])
    try:
        _load(context, tls)
    except (OSError, ssl.SSLError) as exc:
        raise SpecError(
            f"--tls-cert {tls.cert_file}, --tls-key {tls.key_file}: not a readable PEM "
            f"certificate and its private key: {_reason(exc)}"
        ) from None
    return context


async def keep_loaded(
    context: ssl.SSLContext, tls: RelayTls, *, every: float = RELOAD_EVERY
) -> None:
    """Load ``tls``'s files into ``context`` again whenever they changed; until cancelled."""
    loaded = tried = _stamp(tls)
    while True:
        await trio.sleep(every)
        try:
            now = _stamp(tls)
            if now in (loaded, tried):
                continue
            tried = now
            _load(context, tls)
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "relay: the certificate %s did not load (%s); serving the one loaded before "
                "until the files change again",
                tls.cert_file,
                _reason(exc),
            )
            continue
        loaded = now
        log.info("relay: loaded the changed certificate %s", tls.cert_file)


def _load(context: ssl.SSLContext, tls: RelayTls) -> None:
    context.load_cert_chain(certfile=str(tls.cert_file), keyfile=str(tls.key_file))


def _stamp(tls: RelayTls) -> tuple[int, int, int, int]:
    """The files' modification times and sizes (through the kubelet's symlinks)."""
    cert, key = tls.cert_file.stat(), tls.key_file.stat()
    return cert.st_mtime_ns, cert.st_size, key.st_mtime_ns, key.st_size


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
