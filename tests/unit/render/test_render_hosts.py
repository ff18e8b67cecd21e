from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from render_fixtures import DUAL, EXAMPLE, LAB, LAB6

from vnetd.render.hosts import HostsFileError, render_hosts_block, splice_block
from vnetd.render.output import OutputError, update_hosts_file
from vnetd.spec import load_spec

BLOCK = "# BEGIN vnetd mesh lab\n10.250.0.1\tlab-0\n# END vnetd mesh lab\n"
OLD = "# BEGIN vnetd mesh lab\n10.9.9.9\tstale\n# END vnetd mesh lab\n"
OTHER = "# BEGIN vnetd mesh lab-2\n10.251.0.1\tlab-2-0\n# END vnetd mesh lab-2\n"


@pytest.mark.parametrize(
    ("spec", "domain", "name"),
    [
        pytest.param(LAB, None, "hosts-lab.txt", id="ipv4"),
        pytest.param(LAB, "cluster.local", "hosts-lab-domain.txt", id="ipv4-domain"),
        pytest.param(LAB6, "hpc.example.org", "hosts-lab6-domain.txt", id="ipv6-domain"),
        pytest.param(load_spec(EXAMPLE), None, "hosts-example.txt", id="example-spec"),
        pytest.param(DUAL, None, "hosts-ds.txt", id="dual-stack"),
        pytest.param(DUAL, "cluster.local", "hosts-ds-domain.txt", id="dual-stack-domain"),
    ],
)
def test_hosts_block_matches_golden(spec, domain, name, golden):
    golden(name, render_hosts_block(spec, domain))


def test_dual_stack_hosts_block_has_a_line_per_family_ipv4_first():
    lines = render_hosts_block(DUAL).splitlines()[2:-1]
    assert lines == [
        line
        for r in range(3)
        for line in (f"10.250.0.{r + 1}\tds-{r}", f"fd00:250::{r + 1}\tds-{r}")
    ]


def test_hosts_block_lines():
    lines = render_hosts_block(LAB, "cluster.local").splitlines()
    assert lines[0] == "# BEGIN vnetd mesh lab"
    assert lines[2:-1] == [f"10.250.0.{r + 1}\tlab-{r}.cluster.local\tlab-{r}" for r in range(4)]
    assert lines[-1] == "# END vnetd mesh lab"
    assert render_hosts_block(LAB6).splitlines()[2] == "fd00:250::1\tlab6-0"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param("", BLOCK, id="empty-file"),
        pytest.param("127.0.0.1\tlocalhost\n", "127.0.0.1\tlocalhost\n" + BLOCK, id="append"),
        pytest.param(
            "127.0.0.1 localhost", "127.0.0.1 localhost\n" + BLOCK, id="append-adds-missing-newline"
        ),
        pytest.param(
            "127.0.0.1 localhost\r\n" + OLD + "::1  ip6-localhost \t \r\n# comment\n10.0.0.9 x",
            "127.0.0.1 localhost\r\n" + BLOCK + "::1  ip6-localhost \t \r\n# comment\n10.0.0.9 x",
            id="replace-keeps-crlf-whitespace-comments-no-final-newline",
        ),
        pytest.param(
            "a\n  # BEGIN vnetd mesh lab \r\nold\n\t# END vnetd mesh lab\r\nb\n",
            "a\n" + BLOCK + "b\n",
            id="markers-with-odd-whitespace-and-crlf",
        ),
        pytest.param("a\n" + OLD.rstrip("\n"), "a\n" + BLOCK, id="block-at-end-without-newline"),
        pytest.param(OTHER + OLD + OTHER, OTHER + BLOCK + OTHER, id="other-meshes-untouched"),
        pytest.param(
            "# BEGIN vnetd mesh la\nx\n# END vnetd mesh la\n",
            "# BEGIN vnetd mesh la\nx\n# END vnetd mesh la\n" + BLOCK,
            id="prefix-name-is-another-mesh",
        ),
        pytest.param(
            "# BEGIN vnetd mesh lab # not a marker\n",
            "# BEGIN vnetd mesh lab # not a marker\n" + BLOCK,
            id="marker-must-be-whole-line",
        ),
        pytest.param("a\n\n\n", "a\n\n\n" + BLOCK, id="blank-lines-kept"),
    ],
)
def test_splice(before: str, after: str):
    assert splice_block(before, BLOCK, "lab") == after
    assert splice_block(after, BLOCK, "lab") == after, "not idempotent"


def test_two_meshes_coexist_and_update_independently():
    text = "127.0.0.1 localhost\n"
    lab, lab6 = render_hosts_block(LAB), render_hosts_block(LAB6)
    text = splice_block(text, lab, "lab")
    text = splice_block(text, lab6, "lab6")
    assert text == "127.0.0.1 localhost\n" + lab + lab6
    lab_domain = render_hosts_block(LAB, "cluster.local")
    text = splice_block(text, lab_domain, "lab")
    assert text == "127.0.0.1 localhost\n" + lab_domain + lab6
    assert splice_block(text, lab6, "lab6") == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "x\n# BEGIN vnetd mesh lab\ny\n",
            r"line 2 holds '# BEGIN vnetd mesh lab' but no line holds '# END",
            id="begin-only",
        ),
        pytest.param(
            "# END vnetd mesh lab\n",
            r"line 1 holds '# END vnetd mesh lab' but no line holds '# BEGIN",
            id="end-only",
        ),
        pytest.param(OLD + OLD, r"lines 1, 4 all hold '# BEGIN vnetd mesh lab'", id="two-blocks"),
        pytest.param(
            OLD + "# END vnetd mesh lab\n",
            r"lines 3, 4 all hold '# END vnetd mesh lab'",
            id="two-ends",
        ),
        pytest.param(
            "# END vnetd mesh lab\n# BEGIN vnetd mesh lab\n",
            r"line 1 .* comes before line 2",
            id="end-before-begin",
        ),
    ],
)
def test_broken_markers_are_errors(text: str, message: str):
    with pytest.raises(HostsFileError, match=message):
        splice_block(text, BLOCK, "lab")


def test_update_creates_missing_file(tmp_path: Path):
    path = tmp_path / "hosts"
    assert update_hosts_file(path, BLOCK, "lab") is True
    assert path.read_text() == BLOCK
    assert path.stat().st_mode & 0o777 == 0o644


def test_update_replaces_block_keeps_bytes_mode_and_is_idempotent(tmp_path: Path):
    path = tmp_path / "hosts"
    before = (
        b"127.0.0.1 localhost\r\n# caf\xe9 latin-1\n" + OLD.encode() + b"\t10.0.0.9  x  \n# tail"
    )
    path.write_bytes(before)
    path.chmod(0o640)
    assert update_hosts_file(path, BLOCK, "lab") is True
    after = path.read_bytes()
    assert after == before.replace(OLD.encode(), BLOCK.encode())
    assert path.stat().st_mode & 0o777 == 0o640
    stat_before = path.stat()
    assert update_hosts_file(path, BLOCK, "lab") is False
    assert path.read_bytes() == after
    assert path.stat().st_ino == stat_before.st_ino
    assert path.stat().st_mtime_ns == stat_before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


def test_update_leaves_broken_file_untouched(tmp_path: Path):
    path = tmp_path / "hosts"
    path.write_text("# BEGIN vnetd mesh lab\n10.9.9.9 stale\n")
    stat_before = path.stat()
    with pytest.raises(HostsFileError, match=rf"^{path}: line 1 .*; the file was not changed$"):
        update_hosts_file(path, BLOCK, "lab")
    assert path.read_text() == "# BEGIN vnetd mesh lab\n10.9.9.9 stale\n"
    assert path.stat().st_mtime_ns == stat_before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


@pytest.mark.parametrize(
    "code", [pytest.param(errno.EBUSY, id="EBUSY"), pytest.param(errno.EXDEV, id="EXDEV")]
)
def test_update_falls_back_to_in_place_on_a_mount_point(tmp_path: Path, code: int):
    path = tmp_path / "hosts"
    path.write_text(
        "127.0.0.1 localhost\n" + OLD + "# a longer tail than the new block leaves " * 3 + "\n"
    )
    path.chmod(0o604)
    inode = path.stat().st_ino
    warnings: list[str] = []

    def busy(src: str, dst: str) -> None:
        raise OSError(code, os.strerror(code), dst)

    assert update_hosts_file(path, BLOCK, "lab", rename=busy, warn=warnings.append) is True
    assert path.read_text() == (
        "127.0.0.1 localhost\n" + BLOCK + "# a longer tail than the new block leaves " * 3 + "\n"
    )
    assert path.stat().st_ino == inode, "must be rewritten in place, not replaced"
    assert path.stat().st_mode & 0o777 == 0o604
    assert warnings == [
        f"{path} was rewritten in place, not atomically, because it is a mount point "
        f"(rename failed: {os.strerror(code)})"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"], "temp file left behind"


def test_update_in_place_truncates_a_shrinking_file(tmp_path: Path):
    path = tmp_path / "hosts"
    path.write_text(OLD.replace("stale", "a-very-long-stale-name " * 20))

    def busy(src: str, dst: str) -> None:
        raise OSError(errno.EBUSY, "busy")

    update_hosts_file(path, BLOCK, "lab", rename=busy, warn=lambda _: None)
    assert path.read_text() == BLOCK


def test_update_other_rename_errors_are_reported(tmp_path: Path):
    path = tmp_path / "hosts"
    path.write_text(OLD)

    def denied(src: str, dst: str) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(OutputError, match=rf"^{path}: cannot write: Permission denied$"):
        update_hosts_file(path, BLOCK, "lab", rename=denied)
    assert path.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


def test_update_refuses_a_directory(tmp_path: Path):
    with pytest.raises(OutputError, match="not a regular file; give the path of a hosts file"):
        update_hosts_file(tmp_path, BLOCK, "lab")
