"""``vnetd status`` in a mesh with sites: each member's site, and how this host reaches it."""

from __future__ import annotations

import io

from shared import wide_key as key

from vnetd.model import Member
from vnetd.spec import parse_spec
from vnetd.status.table import plain_console, print_plain, status_renderable
from vnetd.status.view import as_json, rank_rows

NOW = 1_700_000_000.0
MESH = {"name": "unit", "size": 8, "network": "10.250.0.0/16"}
GATEWAYED = parse_spec({"mesh": MESH, "sites": {"b": {"gateways": [4, 5]}}})


def member(rank: int) -> Member:
    """Site a (0-3) public; site b (4-7) behind gateways 4 and 5."""
    site = "a" if rank < 4 else "b"
    public = f"198.18.0.9:{40000 + rank}" if rank < 6 else None
    return Member(rank, key(rank), f"10.0.0.{rank}:51820", f"pod{rank}", NOW - 60, "0.1.0", "",
                  site, public)  # fmt: skip


def reached(rows) -> dict[int, tuple[str | None, str | None]]:
    return {row.rank: (row.site, row.reached) for row in rows if row.registered}


def test_seen_from_a_public_member_members_behind_a_gateway_are_reached_through_it():
    members = {r: member(r) for r in (0, 1, 4, 5, 6)}
    rows = rank_rows(GATEWAYED, members, None, NOW, local_key=key(0))
    assert reached(rows) == {
        0: ("a", "this host"),
        1: ("a", "direct"),
        4: ("b", "direct"),
        5: ("b", "direct"),
        6: ("b", "via gateway 4"),
    }


def test_seen_from_behind_a_gateway_other_sites_go_through_our_own():
    members = {r: member(r) for r in (0, 4, 5, 6, 7)}
    rows = rank_rows(GATEWAYED, members, None, NOW, local_key=key(7))
    assert reached(rows) == {
        0: ("a", "via gateway 4"),
        4: ("b", "direct"),
        5: ("b", "direct"),
        6: ("b", "direct"),
        7: ("b", "this host"),
    }


def test_a_rank_whose_gateway_is_absent_has_no_route():
    members = {r: member(r) for r in (0, 6)}
    rows = rank_rows(GATEWAYED, members, None, NOW, local_key=key(0))
    assert reached(rows)[6] == ("b", "no route")


def test_without_a_device_this_host_is_seen_as_a_member_of_the_specs_site():
    # The spec's [site] table is site a's: the view of a public member of a.
    spec = parse_spec({"mesh": MESH, "site": {"name": "a"}, "sites": {"b": {"gateways": [4]}}})
    members = {r: member(r) for r in (0, 4, 6)}
    assert reached(rank_rows(spec, members, None, NOW)) == {
        0: ("a", "direct"),
        4: ("b", "direct"),
        6: ("b", "via gateway 4"),
    }


def test_the_table_and_the_json_name_the_site_and_the_path():
    members = {r: member(r) for r in (0, 4, 6)}
    rows = rank_rows(GATEWAYED, members, None, NOW, local_key=key(0))
    out = io.StringIO()
    print_plain(plain_console(out), status_renderable(GATEWAYED, rows, NOW, plain=True))
    header = out.getvalue().splitlines()[1].split()
    assert header[:8] == ["rank", "address", "hostname", "state", "pod", "site", "reached",
                          "endpoint"]  # fmt: skip
    assert "via gateway 4" in out.getvalue()
    doc = as_json(GATEWAYED, members, None, NOW, local_key=key(0))
    assert (doc["ranks"][6]["site"], doc["ranks"][6]["reached"]) == ("b", "via gateway 4")
    assert "site" not in doc["ranks"][7], "a missing rank has no site"


def test_a_single_site_mesh_has_no_site_columns_nor_keys():
    spec = parse_spec({"mesh": MESH})
    members = {r: Member(r, key(r), f"10.0.0.{r}:51820", f"pod{r}") for r in range(3)}
    rows = rank_rows(spec, members, None, NOW)
    assert all(row.site is None and row.reached is None for row in rows)
    out = io.StringIO()
    print_plain(plain_console(out), status_renderable(spec, rows, NOW, plain=True))
    assert "site" not in out.getvalue() and "reached" not in out.getvalue()
    assert all("site" not in row for row in as_json(spec, members, None, NOW)["ranks"])
