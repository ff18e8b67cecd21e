"""A relay's TLS: its certificate and key in one server context, loaded again when the
files change.

cert-manager renews a certificate into the same Secret, and the kubelet swaps the
mounted files in place, so a relay looks at them every ``RELOAD_EVERY`` s and loads
the new pair into the context it serves with: the handshakes after that present the
renewed certificate, without a restart or a dropped watch. A pair is loaded whole or not
at all (``load_pair``): one that does not load (caught half-written, a key that is not
the certificate's) is logged once and tried again when the files change again; the
loaded one stays until then.

The context offers HTTP/1.1 only (the daemons' httpx speaks nothing else) and asks no
client certificate: a relay serves reads of signed records to whoever reaches it
(docs/architecture.md, "Relay").
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from vnetd.errors import SpecError

log = logging.getLogger("vnetd.relay")

RELOAD_EVERY = 60.0
"""Seconds between two looks at the certificate's and key's files."""

Stamp = tuple[int, int, int, int]
"""The certificate's and key's modification times and sizes (``stamp``)."""


@dataclass(frozen=True)
class RelayTls:
    """The PEM files a relay serves HTTPS with."""

    cert_file: Path
    key_file: Path


def server_context(tls: RelayTls) -> tuple[ssl.SSLContext, Stamp]:
    """A server context holding ``tls``'s pair, and the stamp of the files it holds.

    Raises:
        SpecError: a file cannot be read, or the pair is not a PEM certificate and
            its key (one line, naming the flag).
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.set_alpn_protocols(["http/1.1"])
    try:
        loaded = load_pair(context, tls)
    except (OSError, ssl.SSLError) as exc:
        raise SpecError(
            f"--tls-cert {tls.cert_file}, --tls-key {tls.key_file}: not a readable PEM "
            f"certificate and its private key: {_reason(exc)}"
        ) from None
    return context, loaded


async def keep_loaded(
    context: ssl.SSLContext,
    tls: RelayTls,
    loaded: Stamp,
    *,
    every: float = RELOAD_EVERY,
) -> None:
    """Load ``tls``'s files into ``context`` again whenever they changed from ``loaded``
    (``load_pair``'s stamp of what the context holds); until cancelled."""
    tried = loaded
    while True:
        await trio.sleep(every)
        try:
            now = stamp(tls)
            if now in (loaded, tried):
                continue
            tried = now
            loaded = load_pair(context, tls)
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "relay: the certificate %s did not load (%s); serving the one loaded before "
                "until the files change again",
                tls.cert_file,
                _reason(exc),
            )
            continue
        log.info("relay: loaded the changed certificate %s", tls.cert_file)


def stamp(tls: RelayTls) -> Stamp:
    """The files' modification times and sizes (through the kubelet's symlinks)."""
    cert, key = tls.cert_file.stat(), tls.key_file.stat()
    return cert.st_mtime_ns, cert.st_size, key.st_mtime_ns, key.st_size


def load_pair(context: ssl.SSLContext, tls: RelayTls) -> Stamp:
    """Load ``tls``'s pair into ``context`` whole or not at all; the files' stamp as read.

    ``load_cert_chain`` on a context in use is not all or nothing: a certificate whose
    key does not match leaves the context with the new certificate and no key, and every
    handshake after fails. So the pair is read once, into anonymous in-memory files (the
    relay's root file system is read-only), tried on a context of its own, and only then
    loaded into ``context`` from the same bytes.

    Raises:
        OSError: a file cannot be read.
        ssl.SSLError: the pair is not a certificate and its key.
    """
    before = stamp(tls)
    pair = tls.cert_file.read_bytes(), tls.key_file.read_bytes()
    with _in_memory(pair[0]) as cert, _in_memory(pair[1]) as key:
        trial = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        trial.load_cert_chain(certfile=cert, keyfile=key)
        context.load_cert_chain(certfile=cert, keyfile=key)
    return before


@contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A path to an anonymous file holding ``data`` (``memfd_create``), closed after."""
    fd = os.memfd_create("vnetd-relay-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
