"""Writing rendered files: atomically, or in place where a mount point forbids a rename.

``write_file`` writes a temporary file in the target's directory, fsyncs it,
gives it the old file's mode and (as root) owner, and renames it over the
target, so a reader sees the old or the new file, never half of one. A file
that already holds the same bytes with the wanted mode is not touched.

A file bind-mounted over another (``/etc/hosts`` in a Kubernetes container)
cannot be renamed over: ``rename`` fails with ``EBUSY`` (or ``EXDEV``). Then
the file is rewritten in place (open, write, truncate, fsync), which is not
atomic, and one line on stderr says so.

``update_hosts_file`` is the ``--write`` of ``vnetd hosts``: read, splice this
mesh's block in, write as above.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from vnetd.errors import VnetdError
from vnetd.render.hosts import HostsFileError, splice_block

Rename = Callable[[str, str], None]
Warn = Callable[[str], None]

NEW_FILE_MODE = 0o644
_MOUNT_POINT_ERRNOS = (errno.EBUSY, errno.EXDEV)


class OutputError(VnetdError):
    """A rendered file could not be read or written."""


def warn_on_stderr(message: str) -> None:
    print(f"vnetd: warning: {message}", file=sys.stderr)


def write_file(
    path: Path,
    data: bytes,
    *,
    mode: int | None = None,
    rename: Rename = os.replace,
    warn: Warn = warn_on_stderr,
) -> bool:
    """Replace ``path`` with ``data`` atomically (in place on a mount point).

    A symlink is followed: its target is replaced and the link kept.

    Args:
        mode: the file's mode; None keeps the old file's, else 0644.
        rename: ``os.replace``; tests pass one that fails with ``EBUSY``.
        warn: receives the one line saying a file was rewritten in place.

    Returns:
        False when the file already held ``data`` with that mode and was left alone.

    Raises:
        OutputError: naming the path and the system's reason.
    """
    target = Path(os.path.realpath(path))
    try:
        old = _stat(target)
        _check_regular(path, old, "leave out -o to write to stdout")
        wanted_mode = mode if mode is not None else (old.st_mode if old else NEW_FILE_MODE)
        wanted_mode = stat.S_IMODE(wanted_mode)
        if old and stat.S_IMODE(old.st_mode) == wanted_mode and target.read_bytes() == data:
            return False
        tmp = _write_temp(target, data, wanted_mode, old)
        try:
            rename(tmp, str(target))
        except OSError as exc:
            _remove(tmp)
            if old is None or exc.errno not in _MOUNT_POINT_ERRNOS:
                raise
            _rewrite_in_place(target, data, wanted_mode)
            warn(
                f"{path} was rewritten in place, not atomically, because it is a mount "
                f"point (rename failed: {exc.strerror})"
            )
            return True
        except BaseException:
            _remove(tmp)
            raise
        _fsync_dir(target.parent)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return True


def update_hosts_file(
    path: Path,
    block: str,
    name: str,
    *,
    rename: Rename = os.replace,
    warn: Warn = warn_on_stderr,
) -> bool:
    """Put mesh ``name``'s ``block`` into the hosts file at ``path``.

    Replaces the block between this mesh's markers and keeps every other
    byte; without a block, appends it; a missing file is created.

    Returns:
        False when the file already held this block and was not written.

    Raises:
        HostsFileError: the markers are broken; the file is left untouched.
        OutputError: the file cannot be read or written.
    """
    try:
        _check_regular(path, _stat(path), "give the path of a hosts file")
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    except OSError as exc:
        raise OutputError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = splice_block(old.decode("utf-8", "surrogateescape"), block, name)
    except HostsFileError as exc:
        raise HostsFileError(f"{path}: {exc}; the file was not changed") from None
    new = text.encode("utf-8", "surrogateescape")
    if new == old:
        return False
    return write_file(path, new, rename=rename, warn=warn)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _check_regular(path: Path, info: os.stat_result | None, fix: str) -> None:
    """Refuse devices, pipes and directories (``-o /dev/stdout``): they cannot be replaced."""
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{path}: not a regular file; {fix}")


def _write_temp(target: Path, data: bytes, mode: int, old: os.stat_result | None) -> str:
    """A fsynced temporary file beside ``target`` with its final mode and owner."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if old is not None and os.geteuid() == 0:
                os.fchown(handle.fileno(), old.st_uid, old.st_gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _rewrite_in_place(target: Path, data: bytes, mode: int) -> None:
    with target.open("r+b") as handle:
        handle.write(data)
        handle.truncate()
        handle.flush()
        if stat.S_IMODE(os.fstat(handle.fileno()).st_mode) != mode:
            os.fchmod(handle.fileno(), mode)
        os.fsync(handle.fileno())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; some filesystems refuse to open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
