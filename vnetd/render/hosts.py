"""The ``/etc/hosts`` block of a mesh, and splicing it into an existing hosts file.

The block is wrapped in marker lines named after the mesh, so the blocks of
several meshes can live in one file and each is replaced on its own::

    # BEGIN vnetd mesh NAME
    ...
    # END vnetd mesh NAME

Splicing keeps every byte outside this mesh's block as it is (other
blocks, comments, CRLF lines, odd whitespace). The block itself is written
with ``\\n`` line ends. Text is ``str``; callers decode with
``surrogateescape`` so that bytes that are not UTF-8 survive.
"""

from __future__ import annotations

from vnetd.errors import VnetdError
from vnetd.spec import MeshSpec


class HostsFileError(VnetdError):
    """A hosts file whose marker lines for this mesh are broken."""


def begin_marker(name: str) -> str:
    return f"# BEGIN vnetd mesh {name}"


def end_marker(name: str) -> str:
    return f"# END vnetd mesh {name}"


def render_hosts_block(spec: MeshSpec, domain: str | None = None) -> str:
    """``ADDRESS<TAB>HOSTNAME`` per rank between the markers, ending in a newline.

    With ``domain``: ``ADDRESS<TAB>HOSTNAME.DOMAIN<TAB>HOSTNAME`` (the
    canonical name first, the short name as an alias). A dual-stack mesh gets
    two lines per rank with the same names, the IPv4 address first.
    """
    lines = [
        begin_marker(spec.name),
        "# Written by vnetd from the mesh spec: lines between these markers are replaced.",
    ]
    for rank in range(spec.size):
        host = spec.host(rank)
        names = f"{host}.{domain}\t{host}" if domain else host
        lines.extend(f"{address}\t{names}" for address in spec.addresses(rank))
    lines.append(end_marker(spec.name))
    return "\n".join(lines) + "\n"


def splice_block(text: str, block: str, name: str) -> str:
    """``text`` with mesh ``name``'s block replaced by ``block``, or ``block`` appended.

    A file that does not end in a newline gets one before an appended block.

    Raises:
        HostsFileError: the markers of ``name`` are duplicated, unpaired or
            out of order; the message gives the line numbers and the fix.
    """
    lines = _split_lines(text)
    begins = [i for i, line in enumerate(lines) if line.strip() == begin_marker(name)]
    ends = [i for i, line in enumerate(lines) if line.strip() == end_marker(name)]
    if not begins and not ends:
        separator = "" if text == "" or text.endswith("\n") else "\n"
        return text + separator + block
    _check_markers(name, begins, ends)
    first, last = begins[0], ends[0]
    return "".join(lines[:first]) + block + "".join(lines[last + 1 :])


def _check_markers(name: str, begins: list[int], ends: list[int]) -> None:
    begin, end = begin_marker(name), end_marker(name)
    for marker, found in ((begin, begins), (end, ends)):
        if len(found) > 1:
            raise HostsFileError(
                f"lines {_numbers(found)} all hold {marker!r}: keep one block of "
                f"mesh {name} and remove the others by hand"
            )
    if not ends:
        raise HostsFileError(
            f"line {begins[0] + 1} holds {begin!r} but no line holds {end!r}: "
            "add the END line after the block, or remove the BEGIN line"
        )
    if not begins:
        raise HostsFileError(
            f"line {ends[0] + 1} holds {end!r} but no line holds {begin!r}: "
            "add the BEGIN line before the block, or remove the END line"
        )
    if ends[0] < begins[0]:
        raise HostsFileError(
            f"line {ends[0] + 1} ({end!r}) comes before line {begins[0] + 1} ({begin!r}): "
            "put the markers around the block in order"
        )


def _numbers(indexes: list[int]) -> str:
    return ", ".join(str(i + 1) for i in indexes)


def _split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept; only ``\\n`` ends a line (``\\r`` stays in it)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines
