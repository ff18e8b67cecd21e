"""Proof that a member record was written by its holder: an Ed25519 signature.

WireGuard's X25519 key cannot sign, so each daemon keeps an Ed25519 signing
key beside its WireGuard key (``load_or_create_signer``: ``signing.key`` in
the state dir, 0600, by the rules of ``vnetd.keys``), or takes it from a file
it is given (``open_signer``: ``--signing-key-file``, e.g. a pinned gateway's
key from a mounted Secret), and signs every record it writes. The signature
covers the registry key, the lease the record is written under and the
record's canonical JSON, so a record copied to another rank or written under
another lease does not verify. Readers let an entry held by one signing key
change only under that key, and bind a public key to the signing key that
first registered it (docs/architecture.md, "Registry layout"). The signature
itself is standard Ed25519; only the bytes signed are defined here.

Two libraries, each where it is cheaper: a daemon signs once per claim, with
cryptography's Ed25519, which it imports anyway for its WireGuard key; it
verifies every record of every peer (1023 in a storm at 1024 ranks), with
libsodium's (PyNaCl's ``crypto_sign_open``), which takes half the CPU of
cryptography's here (docs/architecture.md, "Registry layout"). Both are
imported where a key is made or a proof checked, not with the module: the
codec that imports this module is also imported by ``--help`` and the render
commands, which must stay light, and a daemon with no peer to check never
loads libsodium.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import TYPE_CHECKING

from vnetd.errors import IdentityError
from vnetd.model import key_bytes

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SIGNING_KEY_FILE = "signing.key"
_DOMAIN = b"vnetd member record v1\n"
"""Signed first, so a signature made for this use can serve no other."""


class Signer:
    """A holder's Ed25519 key: signs records; ``public_key`` goes into each one."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_key = base64.b64encode(private.public_key().public_bytes_raw()).decode()

    @classmethod
    def generate(cls) -> Signer:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> Signer:
        """Raises ValueError unless ``raw`` is a 32-byte Ed25519 seed."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        return self._private.private_bytes_raw()

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The key itself, for what signs other than a record (a rank certificate)."""
        return self._private

    def sign(self, key: str, lease: int, body: bytes) -> str:
        """The base64 proof of ``body`` written at registry ``key`` under ``lease``."""
        return base64.b64encode(self._private.sign(signed_bytes(key, lease, body))).decode()

    def __repr__(self) -> str:  # the private key never reaches a log
        return f"Signer(public_key={self.public_key!r})"


def signed_bytes(key: str, lease: int, body: bytes) -> bytes:
    """What a proof signs: the domain, the registry key, the lease id and the record."""
    return b"".join((_DOMAIN, key.encode("utf-8", "surrogateescape"), b"\n",
                     str(lease).encode(), b"\n", body))  # fmt: skip


def verify(signing_key: str, proof: str, key: str, lease: int, body: bytes) -> bool:
    """Whether ``proof`` is ``signing_key``'s signature of ``body`` at ``key`` under ``lease``."""
    from nacl.bindings import crypto_sign_BYTES, crypto_sign_open
    from nacl.exceptions import BadSignatureError

    try:
        public = key_bytes(signing_key)
        signature = base64.b64decode(proof, validate=True)
        if len(signature) != crypto_sign_BYTES:
            return False
        crypto_sign_open(signature + signed_bytes(key, lease, body), public)
    except (ValueError, binascii.Error, BadSignatureError):
        return False
    return True


def verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``message`` by ``public`` (raw
    bytes: a rank certificate's, ``control.rank_cert``), with libsodium as proofs."""
    from nacl.bindings import crypto_sign_BYTES, crypto_sign_open
    from nacl.exceptions import BadSignatureError

    if len(signature) != crypto_sign_BYTES or len(public) != 32:
        return False
    try:
        crypto_sign_open(signature + message, public)
    except (ValueError, BadSignatureError):
        return False
    return True


def load_or_create_signer(state_dir: Path) -> Signer:
    """The record signing key in ``state_dir`` (an existing directory), generated on
    first use and kept across WireGuard key rotations.

    Raises:
        IdentityError: the key file is unusable (open to group or others, not a key).
    """
    from vnetd.keys import write_new  # cryptography with it: see the module docstring

    path = state_dir / SIGNING_KEY_FILE
    try:
        if path.exists():
            return load_signer(path)
        signer = Signer.generate()
        write_new(path, base64.b64encode(signer.private_bytes()).decode() + "\n")
    except OSError as exc:
        raise IdentityError(f"{path}: cannot use the signing key: {exc.strerror}") from None
    return signer


def open_signer(
    named: tuple[str, Path] | None, state_dir: Path | None
) -> tuple[Signer | None, str]:
    """The record signing key and where it comes from (for messages): the file
    ``named`` (the flag, variable or spec key that names it, and its path) if given,
    else ``signing.key`` in ``state_dir`` (the directory made 0700, the key made on
    first use), else none (unsigned records: ``vnetd register`` without either).

    Raises:
        IdentityError: naming the file or directory at fault.
    """
    from vnetd.keys import make_state_dir  # cryptography with it: see the module docstring

    if named is not None:
        source, path = named
        return load_signer(path, source), f"{source} {path}"
    if state_dir is None:
        return None, "no --state-dir"
    make_state_dir(state_dir)
    return load_or_create_signer(state_dir), str(state_dir / SIGNING_KEY_FILE)


def load_signer(path: Path, source: str = "") -> Signer:
    """The signing key in the file ``path``: ``signing.key``'s format (base64 of the
    32-byte Ed25519 seed) or a PKCS8 PEM Ed25519 key (cert-manager's csi-driver's
    ``tls.key``); readable by the owner alone (0600, a Secret's 0400), the PEM key also
    by its group (the csi-driver's 0440), writable by the owner alone.

    Args:
        source: the flag, variable or spec key that named ``path``, put before it in
            every message ("" : the path alone).

    Raises:
        IdentityError: the file is missing, open to group or others, or not a key;
            no message holds any part of the key.
    """
    named = f"{source} {path}" if source else str(path)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text()
    except OSError as exc:
        raise IdentityError(f"{named}: cannot use the signing key: {exc.strerror}") from None
    pem = text.lstrip().startswith("-----BEGIN")
    if mode & (0o037 if pem else 0o077):  # the group may read only the csi-driver's PEM key
        raise IdentityError(
            f"{named}: mode {mode:04o} lets others read the signing key; run chmod 600 {path}"
        )
    try:
        if pem:
            return _pem_signer(text.encode())
        return Signer.from_private_bytes(base64.b64decode(text.strip(), validate=True))
    except ValueError:
        raise IdentityError(
            f"{named}: not a base64 Ed25519 private key (make one with "
            "`vnetd signing-key --create --key-file FILE`)"
        ) from None


def _pem_signer(text: bytes) -> Signer:
    """A PKCS8 PEM key, unencrypted. Raises ValueError: not one, encrypted, or not
    Ed25519."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(text, password=None)
    except (TypeError, UnsupportedAlgorithm):
        raise ValueError("not an unencrypted PEM key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 key")
    return Signer(key)


def create_signer_file(path: Path, source: str) -> Signer:
    """A new signing key in the new file ``path`` (0600, never over a file there).

    Raises:
        IdentityError: ``path`` exists, or cannot be written.
    """
    from vnetd.keys import create_new  # cryptography with it: see the module docstring

    signer = Signer.generate()
    try:
        create_new(path, base64.b64encode(signer.private_bytes()).decode() + "\n")
    except FileExistsError:
        raise IdentityError(
            f"{source} {path}: exists; a key file is never overwritten (a spec may pin its "
            "key): drop --create to print its key, or name a new file"
        ) from None
    except OSError as exc:
        raise IdentityError(f"{source} {path}: cannot write the key: {exc.strerror}") from None
    return signer
