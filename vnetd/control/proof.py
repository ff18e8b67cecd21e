"""Proof that a member record was written by its holder: an Ed25519 signature.

WireGuard's X25519 key cannot sign, so each daemon keeps an Ed25519 signing
key beside its WireGuard key (``load_or_create_signer``: ``signing.key`` in
the state dir, 0600, by the rules of ``vnetd.keys``) and signs
every record it writes. The signature covers the registry key, the lease the
record is written under and the record's canonical JSON, so a record copied
to another rank or written under another lease does not verify. Readers let
an entry held by one signing key change only under that key, and bind a
public key to the signing key that first registered it (docs/architecture.md,
"Registry layout"). The signature itself is cryptography's Ed25519; only the
bytes signed are defined here. cryptography is imported where a key is made or a
proof checked, not with the module: the codec that imports this module is also
imported by ``--help`` and the render commands, which must stay light.
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
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        public = Ed25519PublicKey.from_public_bytes(key_bytes(signing_key))
        public.verify(base64.b64decode(proof, validate=True), signed_bytes(key, lease, body))
    except (ValueError, binascii.Error, InvalidSignature):
        return False
    return True


def load_or_create_signer(state_dir: Path) -> Signer:
    """The record signing key in ``state_dir`` (made by ``keys.load_or_create_key``
    first), generated on first use and kept across WireGuard key rotations.

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


def load_signer(path: Path) -> Signer:
    """The signing key in the file ``path`` (``signing.key``'s format: base64 of the
    32-byte Ed25519 seed, mode 0600).

    Raises:
        IdentityError: the file is missing, open to group or others, or not a key.
    """
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise IdentityError(
                f"{path}: mode {mode:04o} lets others read the signing key; run chmod 600 {path}"
            )
        text = path.read_text()
    except OSError as exc:
        raise IdentityError(f"{path}: cannot use the signing key: {exc.strerror}") from None
    try:
        return Signer.from_private_bytes(base64.b64decode(text.strip(), validate=True))
    except ValueError:
        raise IdentityError(f"{path}: not a base64 Ed25519 private key") from None
