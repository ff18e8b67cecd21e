"""Reading a WireGuard private key file for ``vnetd render wg-quick``.

The rules are the daemon's: one base64 X25519 key (as ``wg genkey`` and
the daemon's ``private.key`` hold it), in a file no group or other user
may access. No error message holds any part of the key.
"""

from __future__ import annotations

import stat
from pathlib import Path

from vnetd.errors import IdentityError
from vnetd.identity import KeyPair, public_key_of

FLAG = "--private-key-file"


def load_private_key(path: Path) -> KeyPair:
    """The key pair of the private key in ``path``.

    Raises:
        IdentityError: the file is missing, unreadable, open to group or
            others, or does not hold a base64 X25519 private key.
    """
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"{FLAG} {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"{FLAG} {path}: mode {mode:04o} lets others read the private key; "
                f"run chmod 600 {path}"
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IdentityError(f"{FLAG} {path}: no such file") from None
    except OSError as exc:
        raise IdentityError(f"{FLAG} {path}: cannot read: {exc.strerror}") from None
    try:
        private_key = raw.decode("ascii").strip()
        return KeyPair(private_key, public_key_of(private_key))
    except ValueError:  # UnicodeDecodeError and binascii.Error are ValueErrors
        raise IdentityError(
            f"{FLAG} {path}: not a base64 X25519 private key (one line, as `wg genkey` prints)"
        ) from None
