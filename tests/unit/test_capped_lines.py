"""``capped_lines``: a watch stream cut into lines, each bounded (docs/architecture.md,
"Bounded reads")."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from vnetd.errors import RegistryUnavailable
from vnetd.registry.etcd_gateway import capped_lines


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def lines_of(*parts: bytes, cap: int = 1024) -> list[str]:
    return [line async for line in capped_lines(chunks_of(*parts), cap)]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        pytest.param((b"a\nb\n",), ["a", "b"], id="two-lines-one-chunk"),
        pytest.param((b"ab", b"c\nd", b"e\n"), ["abc", "de"], id="lines-across-chunks"),
        pytest.param((b"a", b"b", b"c", b"\n"), ["abc"], id="newline-in-its-own-chunk"),
        pytest.param((b"a\n", b"tail"), ["a", "tail"], id="unterminated-tail"),
        pytest.param((b"\n\nx\n",), ["", "", "x"], id="empty-lines"),
    ],
)
async def test_lines_are_cut_at_newlines(parts: tuple[bytes, ...], expected: list[str]) -> None:
    assert await lines_of(*parts) == expected


async def test_a_line_over_the_cap_ends_the_stream() -> None:
    parts = (b"ok\n", *([b"x" * 100] * 20))
    seen: list[str] = []

    async def read_all() -> None:
        async for line in capped_lines(chunks_of(*parts), cap=1024):
            seen.append(line)

    with pytest.raises(RegistryUnavailable, match="over"):
        await read_all()
    assert seen == ["ok"]


async def test_many_small_chunks_of_one_long_line() -> None:
    parts = [b"y" * 16] * 4096 + [b"\nz\n"]
    assert await lines_of(*parts, cap=1 << 20) == ["y" * 16 * 4096, "z"]
