"""Rank sets on the command line: every accepted form, every refusal, and back to text."""

from __future__ import annotations

import time

import pytest

from vnetd.errors import SpecError
from vnetd.ranks import format_ranks, parse_ranks


@pytest.mark.parametrize(
    ("text", "size", "ranks"),
    [
        pytest.param("all", 4, (0, 1, 2, 3), id="all"),
        pytest.param(" ALL ", 2, (0, 1), id="all-any-case-spaces"),
        pytest.param("5", 8, (5,), id="one"),
        pytest.param("0", 1, (0,), id="only-rank"),
        pytest.param("0-7", 8, tuple(range(8)), id="range"),
        pytest.param("3-3", 8, (3,), id="range-of-one"),
        pytest.param("0,3,5-9", 10, (0, 3, 5, 6, 7, 8, 9), id="list"),
        pytest.param(" 0 , 3 ,5 - 6 ", 10, (0, 3, 5, 6), id="spaces-around-items"),
        pytest.param("7,1,4", 8, (1, 4, 7), id="sorted"),
        pytest.param("2-5,3,4-6,5", 8, (2, 3, 4, 5, 6), id="deduplicated"),
        pytest.param("007", 8, (7,), id="leading-zeros"),
        pytest.param("1048575", 1 << 20, (1048575,), id="largest-mesh"),
    ],
)
def test_parse(text, size, ranks):
    assert parse_ranks(text, size) == ranks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "",
            r"--ranks: empty; use all, 5, 0-7 or 0,3,5-9 \(the ranks of this mesh are 0\.\.7\)",
            id="empty",
        ),
        pytest.param("  ", r"--ranks: empty; .*0\.\.7", id="blank"),
        pytest.param("1,,2", r"--ranks: '1,,2' has an empty item; .*0\.\.7", id="empty-item"),
        pytest.param("1,", r"--ranks: '1,' has an empty item; .*0\.\.7", id="trailing-comma"),
        pytest.param("x", r"--ranks: 'x' is not a rank or a range; .*0\.\.7", id="letters"),
        pytest.param("1.5", r"'1\.5' is not a rank or a range; .*0\.\.7", id="decimal"),
        pytest.param("0x1", r"'0x1' is not a rank or a range", id="hex"),
        pytest.param("\u0663", r"is not a rank or a range", id="non-ascii-digit"),
        pytest.param("1-2-3", r"'1-2-3' is not a rank or a range", id="double-range"),
        pytest.param("1-", r"'1-' is not a rank or a range", id="open-range"),
        pytest.param("-1", r"--ranks: '-1' has a sign; ranks are unsigned; .*0\.\.7", id="minus"),
        pytest.param("+2", r"--ranks: '\+2' has a sign; .*0\.\.7", id="plus"),
        pytest.param("0, -3", r"'-3' has a sign", id="sign-in-list"),
        pytest.param(
            "7-3",
            r"--ranks: '7-3' is a reversed range; write 3-7 \(the ranks of this mesh are 0\.\.7\)",
            id="reversed",
        ),
        pytest.param(
            "8",
            r"--ranks: rank 8 is out of range; the ranks of this mesh are 0\.\.7",
            id="too-high",
        ),
        pytest.param(
            "5-8", r"--ranks: rank 8 in '5-8' is out of range; .*0\.\.7", id="range-too-high"
        ),
        pytest.param("0,1,99", r"rank 99 is out of range", id="too-high-in-list"),
        pytest.param(
            "9" * 5000,
            r"rank 9{24}\.\.\. \(5000 digits\) is out of range; .*0\.\.7",
            id="absurdly-long",
        ),
        pytest.param(
            "0-" + "9" * 5000,
            r"rank 9{24}\.\.\. \(5000 digits\) in '0-9{22}'\.\.\. \(5002 characters\)",
            id="absurdly-long-range",
        ),
    ],
)
def test_refused(text, message):
    with pytest.raises(SpecError, match=message):
        parse_ranks(text, 8)


def test_error_names_the_flag_it_is_given():
    with pytest.raises(SpecError, match=r"^--only: rank 3 is out of range"):
        parse_ranks("3", 2, flag="--only")


def test_huge_range_is_refused_before_expanding():
    started = time.perf_counter()
    with pytest.raises(SpecError, match="out of range"):
        parse_ranks("0-" + "9" * 100_000, 8)
    with pytest.raises(SpecError, match="out of range"):
        parse_ranks(",".join(["0-7"] * 1000 + ["10"]), 8)
    assert time.perf_counter() - started < 1.0


def test_overlapping_items_are_expanded_once():
    text = ",".join(["0-1048575"] * 2000)
    started = time.perf_counter()
    assert len(parse_ranks(text, 1 << 20)) == 1 << 20
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        pytest.param([], "", id="none"),
        pytest.param([4], "4", id="one"),
        pytest.param([0, 1, 2, 3], "0-3", id="run"),
        pytest.param([9, 0, 2, 1, 5, 7, 8, 2], "0-2, 5, 7-9", id="unsorted-duplicates"),
        pytest.param(
            [*range(100), 120, *range(130, 160, 2)],
            "0-99, 120, 130, 132, 134, 136, 138, 140, ... (116 in all)",
            id="capped",
        ),
    ],
)
def test_format(ranks, text):
    assert format_ranks(ranks) == text


def test_format_limit_is_in_groups():
    assert format_ranks([0, 2, 4], limit=2) == "0, 2, ... (3 in all)"
    assert format_ranks([0, 2, 4], limit=3) == "0, 2, 4"


@pytest.mark.parametrize("ranks", [[0], [0, 1, 2, 5, 7, 8], [3, 5, 7, 9, 11], list(range(16))])
def test_format_parses_back(ranks):
    assert parse_ranks(format_ranks(ranks), 16) == tuple(ranks)
