from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vnetd.render.output import OutputError, write_file


@pytest.mark.parametrize(
    ("old_mode", "mode", "expected"),
    [
        pytest.param(None, None, 0o644, id="new-file-0644"),
        pytest.param(0o600, None, 0o600, id="keeps-old-mode"),
        pytest.param(0o664, None, 0o664, id="keeps-group-write"),
        pytest.param(None, 0o600, 0o600, id="new-private-0600"),
        pytest.param(0o644, 0o600, 0o600, id="private-tightens-old-mode"),
    ],
)
def test_write_file_modes(tmp_path: Path, old_mode: int | None, mode: int | None, expected: int):
    path = tmp_path / "out"
    if old_mode is not None:
        path.write_bytes(b"old\n")
        path.chmod(old_mode)
    assert write_file(path, b"new\n", mode=mode) is True
    assert path.read_bytes() == b"new\n"
    assert path.stat().st_mode & 0o777 == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_file_is_a_rename(tmp_path: Path):
    path = tmp_path / "out"
    path.write_bytes(b"old\n")
    inode = path.stat().st_ino
    renames: list[tuple[str, str]] = []

    def rename(src: str, dst: str) -> None:
        renames.append((src, dst))
        assert Path(src).parent == tmp_path and Path(src).read_bytes() == b"new\n"
        os.replace(src, dst)

    write_file(path, b"new\n", rename=rename)
    assert len(renames) == 1 and renames[0][1] == str(path)
    assert path.stat().st_ino != inode


def test_write_file_leaves_identical_file_alone(tmp_path: Path):
    path = tmp_path / "out"
    path.write_bytes(b"same\n")
    before = path.stat()

    def no_rename(src: str, dst: str) -> None:
        raise AssertionError("must not write")

    assert write_file(path, b"same\n", rename=no_rename) is False
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_write_file_fixes_mode_even_when_bytes_are_equal(tmp_path: Path):
    path = tmp_path / "wg0.conf"
    path.write_bytes(b"secret\n")
    path.chmod(0o644)
    assert write_file(path, b"secret\n", mode=0o600) is True
    assert path.stat().st_mode & 0o777 == 0o600


def test_write_file_follows_symlinks(tmp_path: Path):
    target = tmp_path / "real"
    target.write_bytes(b"old\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    write_file(link, b"new\n")
    assert link.is_symlink()
    assert target.read_bytes() == b"new\n"


def test_write_file_missing_directory(tmp_path: Path):
    path = tmp_path / "nope" / "out"
    with pytest.raises(OutputError, match=rf"^{path}: cannot write: No such file or directory$"):
        write_file(path, b"x\n")


def test_write_file_new_file_on_mount_error_is_an_error(tmp_path: Path):
    """There is no file to rewrite in place: EBUSY on a new file is reported."""
    path = tmp_path / "out"

    def busy(src: str, dst: str) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    with pytest.raises(OutputError, match="Device or resource busy"):
        write_file(path, b"x\n", rename=busy)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "path",
    [pytest.param(Path("/dev/null"), id="device"), pytest.param(None, id="directory")],
)
def test_write_file_refuses_what_is_not_a_regular_file(tmp_path: Path, path: Path | None):
    path = path or tmp_path
    with pytest.raises(OutputError, match="not a regular file; leave out -o"):
        write_file(path, b"x\n")
