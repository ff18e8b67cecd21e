"""The ``vnetd status`` table, drawn with rich.

On a terminal: a table with a header rule, missing ranks dimmed with their
state in red. Anywhere else (a pipe, a file, a log): the same columns in
plain text, no escape codes, no box characters, no trailing blanks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import IO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from vnetd.spec import MeshSpec
from vnetd.status.view import (
    RankRow,
    format_age,
    format_bytes,
    format_since,
    handshake_line,
    held_notes,
    is_silent,
    summary_line,
    utc_text,
)

PLAIN_WIDTH = 1000
"""The line width for plain output: wide enough that no column is ever wrapped."""

NONE = "-"


def status_renderable(
    spec: MeshSpec,
    rows: Sequence[RankRow],
    now: float,
    *,
    notes: Sequence[str] = (),
    plain: bool = False,
    summary_first: bool = False,
) -> RenderableType:
    """The table, the summary line, the device line and ``notes`` below it.

    Args:
        plain: no box characters (for a pipe or a file).
        summary_first: the summary and notes above the table, not below (the
            live view, which crops a table taller than the terminal at the bottom).
    """
    with_device = any(row.device is not None for row in rows)
    networks = " and ".join(str(net) for net in spec.networks)
    table = Table(
        title=f"mesh {spec.name}: {spec.size} ranks in {networks}, at {utc_text(now)}",
        title_justify="left",
        title_style="bold",
        box=None if plain else box.SIMPLE_HEAD,
        pad_edge=False,
    )
    dual_stack = spec.network6 is not None
    with_sites = any(row.site is not None for row in rows)
    headers = ["rank", "address", *(["address6"] if dual_stack else []), "hostname", "state",
               "pod", *(["site", "reached"] if with_sites else []), "endpoint",
               "since (UTC)"]  # fmt: skip
    for header in headers:
        table.add_column(header, justify="right" if header == "rank" else "left", no_wrap=True)
    if with_device:
        table.add_column("handshake", no_wrap=True)
        table.add_column("rx", justify="right", no_wrap=True)
        table.add_column("tx", justify="right", no_wrap=True)
    for row in rows:
        cells = _cells(row, now)
        if with_sites:
            cells[5:5] = [row.site or NONE, row.reached or NONE]
        if dual_stack:
            cells[2:2] = [",".join(row.addresses[1:]) or NONE]
        if with_device:
            cells += _device_cells(row)
        table.add_row(*cells, style=None if row.registered else "dim")
    lines: list[RenderableType] = [Text(summary_line(rows), style="bold")]
    device = handshake_line(rows)
    if device is not None:
        lines.append(Text(device))
    lines += [Text(note, style="yellow") for note in [*notes, *held_notes(rows, now)]]
    return Group(*lines, table) if summary_first else Group(table, *lines)


def _cells(row: RankRow, now: float) -> list[str | Text]:
    member = row.member
    if member is None:
        state = Text("missing", style="bold red")
        return [str(row.rank), row.address, row.hostname, state, NONE, NONE, NONE]
    since = format_since(member.started, now) if member.started > 0 else NONE
    return [
        str(row.rank),
        row.address,
        row.hostname,
        Text("registered", style="green"),
        member.instance,
        member.endpoint or NONE,
        since,
    ]


def _device_cells(row: RankRow) -> list[str | Text]:
    columns = row.device
    if columns is None:
        return [NONE, NONE, NONE]
    if columns.role == "self":
        return [Text("this device", style="cyan"), NONE, NONE]
    if columns.role == "absent":
        return [Text("not on device", style="yellow"), NONE, NONE]
    if columns.handshake_age is None:
        handshake: str | Text = Text("never", style="yellow")
    else:
        handshake = f"{format_age(columns.handshake_age)} ago"
    if is_silent(row):
        handshake = Text(f"{handshake} (silent)", style="yellow")
    return [handshake, format_bytes(columns.rx_bytes), format_bytes(columns.tx_bytes)]


class _PlainConsole(Console):
    def on_broken_pipe(self) -> None:
        """Leave a closed output to the CLI's entry point, which ends every command the
        same way (rich's own handling would exit 1, vnetd wait's "timed out")."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def plain_console(file: IO[str]) -> Console:
    """A console that writes no escape codes, whatever the environment says."""
    return _PlainConsole(
        file=file,
        width=PLAIN_WIDTH,
        color_system=None,
        force_terminal=False,
        force_interactive=False,
        highlight=False,
        emoji=False,
    )


def print_plain(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable`` through ``console`` without trailing blanks."""
    with console.capture() as captured:
        console.print(renderable)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    console.file.write(text + "\n")
    console.file.flush()
