"""WireGuard keys: the daemon's key pair, a key file, the mesh's pre-shared key.

The private key is X25519, generated once into the state dir (0600 in a
0700 directory) and reused; it is never logged or registered (invariant 7).
``load_private_key`` reads a key file for ``vnetd render wg-quick`` by the
same rules: one base64 key (as ``wg genkey`` prints it), in a file no group
or other user may access, and no error message holds any part of it. With
``registry.etcd.security`` and ``control.proof`` (the record signing key,
kept beside the WireGuard key) this is the only module that imports
cryptography (docs/architecture.md, "Module map").
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from vnetd.errors import IdentityError
from vnetd.model import KeyPair, key_bytes

log = logging.getLogger("vnetd.daemon")

KEY_FILE = "private.key"


def load_or_create_key(state_dir: Path) -> KeyPair:
    """The key pair in ``state_dir``, generating it on first use.

    Raises:
        IdentityError: the directory or key file is unusable.
    """
    make_state_dir(state_dir)
    path = state_dir / KEY_FILE
    if path.exists():
        return _read_key(path)
    key = X25519PrivateKey.generate()
    encoded = base64.b64encode(key.private_bytes_raw()).decode()
    try:
        write_new(path, encoded + "\n")
    except OSError as exc:
        raise IdentityError(f"{path}: cannot write the key: {exc.strerror}") from None
    return KeyPair(encoded, public_key_of(encoded))


def make_state_dir(state_dir: Path) -> None:
    """Make ``state_dir`` (0700) if it is missing, and tighten it to 0700 if it is not.

    Raises:
        IdentityError: it cannot be made or changed.
    """
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _tighten(state_dir)
    except OSError as exc:
        raise IdentityError(f"--state-dir {state_dir}: cannot create: {exc.strerror}") from None


def _tighten(state_dir: Path) -> None:
    """Make the state directory 0700 (a hostPath or a mounted volume may come 0755)."""
    mode = state_dir.stat().st_mode & 0o777
    if mode & 0o077:
        os.chmod(state_dir, 0o700)
        log.info("--state-dir %s: mode %04o tightened to 0700", state_dir, mode)


def write_new(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a fresh 0600 temporary file (never through a
    symlink, never one that was there), synced, then renamed over ``path``."""
    tmp = path.with_suffix(".tmp")
    _write_temporary(tmp, text)
    os.replace(tmp, path)
    _sync_directory(path.parent)


def create_new(path: Path, text: str) -> None:
    """Write a new file ``path``, 0600, whole or not at all, never over a file (or a
    symlink) already there: a 0600 temporary file beside it, synced, then hard-linked
    to ``path`` (``link`` fails if ``path`` exists), and the directory synced.

    Raises:
        FileExistsError: ``path`` exists.
        OSError: anything else the file system refuses.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        _write_temporary(tmp, text)
        os.link(tmp, path, follow_symlinks=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _sync_directory(path.parent)


def _write_temporary(tmp: Path, text: str) -> None:
    """``text`` in a fresh 0600 file ``tmp`` (a leftover of a run that died mid-write is
    removed first; never through a symlink), synced to disk."""
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_directory(directory: Path) -> None:
    """Sync ``directory``, so a file renamed or linked into it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_key(path: Path) -> KeyPair:
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise IdentityError(
                f"{path}: mode {mode:04o} lets others read the private key; run chmod 600 {path}"
            )
        text = path.read_text().strip()
    except OSError as exc:  # a directory, no permission: one line, not a traceback
        raise IdentityError(f"{path}: cannot read the private key: {exc.strerror}") from None
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
        key_bytes(text)
    except ValueError:
        raise IdentityError(
            f"{source} {path}: not a base64 32-byte key (make one with wg genpsk)"
        ) from None
    return text


def public_key_of(private_key: str) -> str:
    """The base64 public key of a base64 X25519 private key.

    Raises:
        ValueError: ``private_key`` is not base64 of 32 bytes.
    """
    public = X25519PrivateKey.from_private_bytes(key_bytes(private_key)).public_key()
    return base64.b64encode(public.public_bytes_raw()).decode()


PRIVATE_KEY_FLAG = "--private-key-file"


def load_private_key(path: Path) -> KeyPair:
    """The key pair of the private key in ``path``.

    Raises:
        IdentityError: the file is missing, unreadable, open to group or
            others, or does not hold a base64 X25519 private key.
    """
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"{PRIVATE_KEY_FLAG} {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"{PRIVATE_KEY_FLAG} {path}: mode {mode:04o} lets others read the private key; "
                f"run chmod 600 {path}"
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IdentityError(f"{PRIVATE_KEY_FLAG} {path}: no such file") from None
    except OSError as exc:
        raise IdentityError(f"{PRIVATE_KEY_FLAG} {path}: cannot read: {exc.strerror}") from None
    try:
        private_key = raw.decode("ascii").strip()
        return KeyPair(private_key, public_key_of(private_key))
    except ValueError:  # UnicodeDecodeError and binascii.Error are ValueErrors
        raise IdentityError(
            f"{PRIVATE_KEY_FLAG} {path}: not a base64 X25519 private key "
            "(one line, as `wg genkey` prints)"
        ) from None
