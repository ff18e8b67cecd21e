"""Rank certificates: a record's signing key vouched for at its rank by the mesh's CA.

Where the spec pins rank CAs (``[mesh] rank_ca``, Ed25519 public keys), a record
at rank k is a member only when it carries ``cert``: an X.509 certificate signed
directly by a pinned key, within its validity (``SKEW`` either side), whose URI
SAN names this mesh and rank k, and whose subject public key is the record's
``signing_key`` (whose proof then verifies, ``membership``). A stolen etcd
credential can then delete and occupy entries, and route nothing to itself
(docs/architecture.md, "Rank certificates"; docs/security.md).

The URI SAN is ``vnetd://<mesh>/rank/<k>`` (``vnetd rank-cert``, a plain host) or
``vnetd://<mesh>/<namespace>/<pod name>/<pod uid>`` (cert-manager's csi-driver
templates it from the pod); a pod name maps to k when it is ``spec.host(k)`` (a
StatefulSet's pod) or that and ``-`` and 5 lowercase letters or digits (an Indexed
Job's or a MiniCluster's ``<job>-<index>-<suffix>``).

A certificate is verified once (parsed with cryptography, its signature checked
with libsodium as proofs are) and remembered by the SHA-256 of its DER, bounded
(Nebula's ``CachedCertificate``); a record that carries it again costs a lookup,
the rank, key and expiry compares.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from vnetd.control.proof import Signer, verify_signature
from vnetd.errors import IdentityError
from vnetd.model import Member, is_ascii_number, key_bytes
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.claim")

SCHEME = "vnetd://"
SKEW = 60.0
"""Seconds of clock difference allowed at either end of a certificate's validity."""
CERT_MAX = 4096
"""Longest ``cert`` field taken (base64): a rank certificate is about 400 bytes of DER."""
CACHE_MIN = 256
"""Certificates remembered at least; a mesh remembers twice its size."""
_SUFFIX = re.compile(r"[a-z0-9]{5}")


@dataclass(frozen=True)
class RankCert:
    """What a certificate signed by a pinned CA says."""

    ca: str
    """The pinned key that signed it."""
    mesh: str
    holder: tuple[str, ...]
    """``("rank", "<k>")``, or ``(namespace, pod name, pod uid)``."""
    public_key: str
    """The subject's Ed25519 public key (base64): the record's signing key."""
    not_before: float
    not_after: float

    def names_rank(self, spec: MeshSpec, rank: int) -> bool:
        """Whether the holder it names is ``rank`` of ``spec``'s mesh."""
        if len(self.holder) == 2:
            return self.holder[1] == str(rank)
        pod, host = self.holder[1], spec.host(rank)
        return pod == host or (
            pod.startswith(f"{host}-") and _SUFFIX.fullmatch(pod[len(host) + 1 :]) is not None
        )

    @property
    def named(self) -> str:
        """The holder, for a message: ``rank 3``, or ``pod <namespace>/<name>``."""
        if len(self.holder) == 2:
            return f"rank {self.holder[1]}"
        return f"pod {self.holder[0]}/{self.holder[1]}"


class CertCache:
    """Verified certificates (and refused ones, with why) by the SHA-256 of their DER
    and the pinned CAs, least recently used first out."""

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[bytes, tuple[str, ...]], RankCert | str] = OrderedDict()
        self.verified = 0
        """Certificates parsed and verified (a cache miss)."""

    def lookup(self, cert: str, spec: MeshSpec) -> RankCert | str:
        """The facts of base64 ``cert`` under ``spec.rank_ca``, or why it is refused."""
        try:
            der = base64.b64decode(cert, validate=True)
        except (binascii.Error, ValueError):
            return "field cert is not base64"
        key = (hashlib.sha256(der).digest(), spec.rank_ca)
        found = self._seen.get(key)
        if found is not None:
            self._seen.move_to_end(key)
            return found
        self.verified += 1
        found = read_cert(der, spec.rank_ca)
        self._seen[key] = found
        while len(self._seen) > max(CACHE_MIN, 2 * spec.size):
            self._seen.popitem(last=False)
        return found

    def clear(self) -> None:
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)


CACHE = CertCache()
"""The readers' cache: one process reads one mesh."""


def refusal(
    spec: MeshSpec,
    rank: int,
    signing_key: object,
    cert: str,
    *,
    now: float | None = None,
    cache: CertCache = CACHE,
) -> str | None:
    """Why the record at ``rank`` signed by ``signing_key`` and carrying ``cert`` is no
    member of ``spec``'s mesh (one clause, for ``membership.BadEntry``), or None:
    the spec pins no rank CA, or ``cert`` vouches for the key at this rank now."""
    if not spec.rank_ca:
        return None
    if not signing_key:
        return "unsigned, and mesh.rank_ca takes only records signed by a rank-certified key"
    if not cert:
        return "carries no field cert, and mesh.rank_ca takes only records with a rank certificate"
    facts = cache.lookup(cert, spec)
    if isinstance(facts, str):
        return facts
    if facts.mesh != spec.name:
        return f"field cert is for mesh {facts.mesh!r}, not {spec.name!r}"
    if not facts.names_rank(spec, rank):
        return f"field cert names {facts.named}, not rank {rank} ({spec.host(rank)})"
    if facts.public_key != signing_key:
        return (f"field cert vouches for signing key {facts.public_key[:12]!r}, and the record "
                f"is signed by {str(signing_key)[:12]!r}")  # fmt: skip
    now = time.time() if now is None else now
    if now < facts.not_before - SKEW:
        return f"field cert is valid only from {_utc(facts.not_before)}"
    if now > facts.not_after + SKEW:
        return f"field cert expired at {_utc(facts.not_after)}"
    return None


def read_cert(der: bytes, rank_ca: tuple[str, ...]) -> RankCert | str:
    """Parse and verify one certificate (no cache): its facts, or why it is refused."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.x509.oid import SignatureAlgorithmOID

    try:
        cert = x509.load_der_x509_certificate(der)
        if cert.signature_algorithm_oid != SignatureAlgorithmOID.ED25519:
            return "field cert is not signed with Ed25519"
        ca = next((ca for ca in rank_ca if verify_signature(
            key_bytes(ca), cert.signature, cert.tbs_certificate_bytes)), None)  # fmt: skip
        if ca is None:
            return "field cert is not signed by a CA of mesh.rank_ca"
        public = cert.public_key()
        if not isinstance(public, Ed25519PublicKey):
            return "field cert's subject key is not an Ed25519 key"
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in sans.get_values_for_type(x509.UniformResourceIdentifier)
                if u.startswith(SCHEME)]  # fmt: skip
        before, after = cert.not_valid_before_utc, cert.not_valid_after_utc
    except x509.ExtensionNotFound:
        return f"field cert has no URI SAN {SCHEME}MESH/..."
    except (ValueError, TypeError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType):
        return "field cert is not an X.509 certificate (DER) vnetd reads"
    holder = _holder(uris)
    if isinstance(holder, str):
        return holder
    mesh, named = holder
    raw = base64.b64encode(public.public_bytes_raw()).decode()
    return RankCert(ca, mesh, named, raw, before.timestamp(), after.timestamp())


def _holder(uris: list[str]) -> tuple[str, tuple[str, ...]] | str:
    """(mesh, holder) of the one ``vnetd://`` URI SAN, or why there is none."""
    if len(uris) != 1:
        return f"field cert has {len(uris)} URI SANs {SCHEME}...; a rank certificate has one"
    mesh, *parts = uris[0][len(SCHEME) :].split("/")
    if len(parts) == 2 and parts[0] == "rank" and is_ascii_number(parts[1]):
        return mesh, ("rank", parts[1])
    if len(parts) == 3 and all(parts):
        return mesh, tuple(parts)
    return f"field cert's URI SAN {uris[0][:80]!r} names no rank and no pod"


def rank_uri(mesh: str, rank: int) -> str:
    """A plain host's URI SAN."""
    return f"{SCHEME}{mesh}/rank/{rank}"


def issue(
    ca: Signer, signing_key: str, uri: str, *, days: float, now: float | None = None
) -> bytes:
    """A rank certificate (DER) for ``signing_key`` naming ``uri``, signed by ``ca``,
    valid from ``now`` for ``days``; no subject name, as the csi-driver's without a CN."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import NameOID

    start = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    subject = Ed25519PublicKey.from_public_bytes(key_bytes(signing_key))
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vnetd rank CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer)
        .public_key(subject)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=True
        )  # fmt: skip
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.private_key, None)
    )
    return cert.public_bytes(Encoding.DER)


def check_own_cert(spec: MeshSpec, rank: int, signing_key: str, cert: str, source: str) -> None:
    """Refuse to claim ``rank`` with a certificate readers would refuse (they would
    skip every record of ours).

    Args:
        source: where ``cert`` comes from, for the message (``--rank-cert-file FILE``).

    Raises:
        IdentityError: naming the certificate and the fix.
    """
    why = refusal(spec, rank, signing_key, cert)
    if why is None:
        return
    where = f" ({source})" if source else " (give --rank-cert-file FILE)"
    raise IdentityError(
        f"rank {rank}: the spec pins mesh.rank_ca, and this record{where} {why}; issue one "
        f"for this signing key with `vnetd rank-cert --rank {rank} ...` or mount the pod's"
    )


RANK_CERT_POLL = 5.0
"""How often ``follow_rank_cert`` reads the certificate file (a renewal is due at two
thirds of a certificate's life: hours)."""


class CertHolder(Protocol):
    """What ``follow_rank_cert`` needs of the claim (``control.claim.ClaimHolder``)."""

    @property
    def me(self) -> Member: ...

    def set_cert(self, cert: str) -> None: ...


async def follow_rank_cert(
    read: Callable[[], str], named: str, spec: MeshSpec, claim: CertHolder
) -> None:
    """Carry the certificate the file holds whenever it changes (the csi-driver renews
    it in place): checked as readers will check it, then our record rewritten
    (``claim.set_cert``). A file that cannot be read, or a certificate readers would
    refuse (a renewal under a new key, another rank), is logged once and the carried
    one kept.

    Args:
        read: the file's certificate as base64 DER (``identity.read_rank_cert``).
        named: the flag, variable or spec key and the file, for the log.
    """
    import trio  # the daemon's: the codec that imports this module serves --help too

    complaint: str | None = ""
    while True:
        await trio.sleep(RANK_CERT_POLL)
        me = claim.me
        try:
            cert = await trio.to_thread.run_sync(read)
        except (OSError, ValueError) as exc:
            problem: str | None = exc.strerror if isinstance(exc, OSError) else str(exc)
        else:
            problem = None if cert == me.cert else refusal(spec, me.rank, me.signing_key, cert)
            if problem is None and cert != me.cert:
                claim.set_cert(cert)
                log.info("rank %d: rank certificate renewed from %s (%s)", me.rank, named,
                         _validity(cert, spec))  # fmt: skip
        if problem is not None and problem != complaint:
            log.warning("rank %d: %s: %s; keeping the certificate carried", me.rank, named,
                        problem)  # fmt: skip
        complaint = problem


def _validity(cert: str, spec: MeshSpec) -> str:
    facts = CACHE.lookup(cert, spec)
    return f"valid until {_utc(facts.not_after)}" if isinstance(facts, RankCert) else facts


def _utc(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
