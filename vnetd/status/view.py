"""What ``vnetd status`` shows, as data: one row per rank of the spec, a summary, a JSON document.

Pure: no trio, no I/O, no clock. The caller passes what it observed (the
registered members, the local device's peers if it could read them) and the
wall-clock time ``now``; the same functions back the CLI table and the
daemon's ``/status`` endpoint, so both say the same thing.

Every rank of the spec gets a row, registered or not: a missing rank is
shown, never hidden. Addresses and hostnames come from the spec (the rank's
fixed plan), endpoints and instances from the registry, handshakes and
counters from the device, matched by the registered public key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from vnetd.errors import REGISTRY_FULL_FIX
from vnetd.mesh.peers import desired_peers
from vnetd.model import DevicePeer, Member
from vnetd.ranks import format_ranks
from vnetd.spec import DEFAULT_SITE, MeshSpec, SiteSpec

SILENT_AFTER = 180.0
"""WireGuard's session lifetime (REJECT_AFTER_TIME, s): a registered peer this device
sent to without a handshake this recent is silent (``held_notes``)."""
NAMED_AT_MOST = 5
"""Silent ranks a note names one by one; more are counted."""

SCHEMA_VERSION = 1
"""Bumped when a field of ``as_json``'s document changes meaning or goes away."""

DeviceRole = Literal["self", "peer", "absent"]
"""How a registered rank relates to the local device: it is the device's own
key, one of its peers, or not (yet) on it."""


@dataclass(frozen=True)
class DeviceColumns:
    """A registered rank as the local device sees it."""

    role: DeviceRole
    endpoint: str | None = None
    """Where the device sends to now (it may have roamed from the registry's)."""
    last_handshake: float = 0.0
    """Wall-clock seconds of the last handshake; 0 = never."""
    handshake_age: float | None = None
    rx_bytes: int = 0
    tx_bytes: int = 0


@dataclass(frozen=True)
class RankRow:
    """One rank of the spec: its fixed plan, its registration, its device view."""

    rank: int
    address: str
    """The primary (``network``) address."""
    hostname: str
    member: Member | None
    """The registry's record; None when the rank is missing."""
    since_age: float | None
    """Seconds since the member's ``started`` time; None when missing or unknown."""
    device: DeviceColumns | None
    """None when no device was read, or the rank is missing."""
    addresses: tuple[str, ...] = ()
    """Every address of the rank, the primary first (two in a dual-stack mesh)."""
    site: str | None = None
    """The member's site; None when the mesh uses no sites (or the rank is missing)."""
    reached: str | None = None
    """How this host reaches the member when the mesh uses sites (``reached_text``)."""

    @property
    def registered(self) -> bool:
        return self.member is not None


def rank_rows(
    spec: MeshSpec,
    members: Mapping[int, Member],
    device: Mapping[str, DevicePeer] | None,
    now: float,
    *,
    local_key: str | None = None,
) -> list[RankRow]:
    """One row per rank of ``spec``, in rank order, registered or not.

    Args:
        members: the valid member records, by rank (ranks outside the spec
            are ignored).
        device: the local device's peers by public key, or None when the
            device was not read (then no row has device columns).
        now: the wall-clock time, seconds since the epoch.
        local_key: the local device's own public key, to mark its rank.
    """
    rows: list[RankRow] = []
    via = reached_from(spec, members, local_key) if uses_sites(spec, members) else None
    for rank in range(spec.size):
        member = members.get(rank)
        since = None if member is None or member.started <= 0 else now - member.started
        columns = None
        if member is not None and device is not None:
            columns = _device_columns(member.public_key, device, now, local_key)
        addresses = tuple(str(addr) for addr in spec.addresses(rank))
        row = RankRow(rank, addresses[0], spec.host(rank), member, since, columns, addresses)
        if via is not None and member is not None:
            row = replace(row, site=member.site, reached=reached_text(rank, via))
        rows.append(row)
    return rows


def uses_sites(spec: MeshSpec, members: Mapping[int, Member]) -> bool:
    """The mesh names sites: gateways in the spec, or a member outside the default site."""
    return bool(spec.gateways) or any(m.site != DEFAULT_SITE for m in members.values())


SELF = -1
"""``reached_from``'s mark for this host's own rank."""


def reached_from(
    spec: MeshSpec, members: Mapping[int, Member], local_key: str | None
) -> dict[int, int | None]:
    """How this host reaches each member (docs/architecture.md, "Sites"): rank -> None
    (a direct peer), the gateway rank whose peer carries its address, or ``SELF``;
    a rank left out has no route (its site's gateway is absent).

    This host is the member registered under ``local_key``; without one, a member
    of the spec's own site that is not a gateway."""
    me = next((r for r, m in members.items() if local_key and m.public_key == local_key), None)
    site = members[me].site if me is not None else spec.site.name
    local = replace(spec, site=SiteSpec(site))
    peers, _ = desired_peers(members, SELF if me is None else me, local, local_key or "")
    rank_of = {ip: rank for rank in members if 0 <= rank < spec.size
               for ip in spec.allowed_ips(rank)}  # fmt: skip
    via: dict[int, int | None] = {} if me is None else {me: SELF}
    for peer in peers.values():
        for ip in peer.allowed_ips:
            rank = rank_of.get(ip)
            if rank is not None:
                via[rank] = None if rank == peer.rank else peer.rank
    return via


def reached_text(rank: int, via: Mapping[int, int | None]) -> str:
    """``direct``, ``via gateway 4``, ``this host`` or ``no route``."""
    if rank not in via:
        return "no route"
    gateway = via[rank]
    if gateway is None:
        return "direct"
    return "this host" if gateway == SELF else f"via gateway {gateway}"


def _device_columns(
    key: str, device: Mapping[str, DevicePeer], now: float, local_key: str | None
) -> DeviceColumns:
    if local_key is not None and key == local_key:
        return DeviceColumns("self")
    peer = device.get(key)
    if peer is None:
        return DeviceColumns("absent")
    age = now - peer.last_handshake if peer.last_handshake > 0 else None
    return DeviceColumns(
        "peer", peer.endpoint, peer.last_handshake, age, peer.rx_bytes, peer.tx_bytes
    )


def missing_ranks(rows: Sequence[RankRow]) -> list[int]:
    return [row.rank for row in rows if not row.registered]


def summary_line(rows: Sequence[RankRow]) -> str:
    """``61/64 registered, 3 missing: 12, 40, 41``; long lists as ranges, capped."""
    missing = missing_ranks(rows)
    line = f"{len(rows) - len(missing)}/{len(rows)} registered"
    if missing:
        line += f", {len(missing)} missing: {format_ranks(missing)}"
    return line


def handshake_line(rows: Sequence[RankRow]) -> str | None:
    """``device: 60/62 registered peers shook hands, never: 5, 9; not on the device: 12``.

    None when no row has device columns (no device was read).
    """
    shaken = 0
    never: list[int] = []
    absent: list[int] = []
    read = False
    for row in rows:
        if row.device is None:
            continue
        read = True
        if row.device.role == "absent":
            absent.append(row.rank)
        elif row.device.role == "peer":
            if row.device.last_handshake > 0:
                shaken += 1
            else:
                never.append(row.rank)
    if not read:
        return None
    line = f"device: {shaken}/{shaken + len(never) + len(absent)} registered peers shook hands"
    if never:
        line += f", never: {format_ranks(never)}"
    if absent:
        line += f"; not on the device: {format_ranks(absent)}"
    return line


def is_silent(row: RankRow) -> bool:
    """A registered peer this device sent to that has had no handshake within
    ``SILENT_AFTER``: its holder may be gone while its lease is kept alive (or cut off)."""
    columns = row.device
    if row.member is None or columns is None or columns.role != "peer":
        return False
    age = columns.handshake_age
    return columns.tx_bytes > 0 and (age is None or age >= SILENT_AFTER)


def held_notes(rows: Sequence[RankRow], now: float) -> list[str]:
    """Notes on entries that may be held by no live daemon, and on this device when it
    is registered at no rank (its daemon's claim waits, or has not run yet). Reports
    only: a holder behind a partition looks the same (docs/security.md)."""
    notes = []
    silent = [row for row in rows if is_silent(row)]
    if silent:
        named = ", ".join(_held_text(row, now) for row in silent[:NAMED_AT_MOST])
        more = f" and {len(silent) - NAMED_AT_MOST} more" if len(silent) > NAMED_AT_MOST else ""
        notes.append(
            f"silent: {named}{more}: registered, but no handshake within {SILENT_AFTER:.0f} s "
            "while this device sent to it (a holder gone with its lease kept alive by another "
            "client, or cut off by a partition; vnetd doctor names held_silent)"
        )
    if any(row.device is not None for row in rows) and not any(
        row.device is not None and row.device.role == "self" for row in rows
    ):
        notes.append(
            "this device is registered at no rank: its daemon has not claimed one (a claim "
            "that waits names the rank's holder in its log and in /status self.held_by)"
        )
    return notes


def _held_text(row: RankRow, now: float) -> str:
    member = row.member
    assert member is not None
    since = f", since {format_since(member.started, now)}" if member.started > 0 else ""
    return f"rank {row.rank} (instance {member.instance!r}{since})"


# --- text for the table ------------------------------------------------------------------


def format_age(seconds: float) -> str:
    """``12 s``, ``4 min 12 s``, ``3 h 5 min``, ``2 d 3 h``; a negative age (clock skew) is 0."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def format_bytes(count: int) -> str:
    """``0 B``, ``812 B``, ``1.23 KiB``, ``45.6 MiB``: binary units, as ``wg show`` prints."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {unit}"


def format_since(started: float, now: float) -> str:
    """``12:03:04 (4 min 12 s)`` in UTC; the date too when it is not today's."""
    at = datetime.fromtimestamp(started, UTC)
    today = datetime.fromtimestamp(now, UTC).date()
    clock = f"{at:%H:%M:%S}" if at.date() == today else f"{at:%Y-%m-%d %H:%M}"
    return f"{clock} ({format_age(now - started)})"


def utc_text(when: float) -> str:
    """``2024-05-01T12:03:04Z``."""
    return f"{datetime.fromtimestamp(when, UTC):%Y-%m-%dT%H:%M:%SZ}"


# --- the JSON document -------------------------------------------------------------------


def registry_full_note(refusal: str) -> str:
    """The note that names a full registry (etcd's NOSPACE): its refusal and the fix; the
    same line in ``vnetd status``, ``vnetd doctor`` and the daemon's ``/status``."""
    return (
        f"registry full: etcd refuses writes ({refusal}); ranks not registered cannot "
        f"claim and records are not updated, the data plane stays as it is; {REGISTRY_FULL_FIX}"
    )


def as_json(
    spec: MeshSpec,
    members: Mapping[int, Member],
    device: Mapping[str, DevicePeer] | None,
    now: float,
    *,
    local_key: str | None = None,
    bad_entries: int = 0,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The status as a JSON-ready document (schema in docs/operations.md).

    Every key is always present; absent values are ``null``. Times are
    wall-clock seconds since the epoch (floats) with a UTC text beside.

    Args:
        members, device, now, local_key: as for ``rank_rows``.
        bad_entries: registry entries skipped because they are not members.
        notes: lines that qualify the document (why there are no device
            columns, a registry outage).
    """
    rows = rank_rows(spec, members, device, now, local_key=local_key)
    return {
        "schema": SCHEMA_VERSION,
        "mesh": spec.name,
        "size": spec.size,
        "network": str(spec.network),
        "network6": None if spec.network6 is None else str(spec.network6),
        "interface": spec.interface,
        "time": now,
        "time_utc": utc_text(now),
        "registered": len(rows) - len(missing_ranks(rows)),
        "missing": missing_ranks(rows),
        "summary": summary_line(rows),
        "bad_entries": bad_entries,
        "device": None if device is None else {"public_key": local_key, "peers": len(device)},
        "notes": [*notes, *held_notes(rows, now)],
        "ranks": [_row_json(row) for row in rows],
    }


def _row_json(row: RankRow) -> dict[str, Any]:
    member = row.member
    started = member.started if member is not None and member.started > 0 else None
    sites = {} if row.site is None else {"site": row.site, "reached": row.reached}
    return {
        "rank": row.rank,
        "address": row.address,
        "addresses": list(row.addresses or (row.address,)),
        "hostname": row.hostname,
        "state": "registered" if member is not None else "missing",
        "instance": member.instance if member else None,
        "endpoint": member.endpoint if member else None,
        "public_key": member.public_key if member else None,
        "version": member.version if member else None,
        "started": started,
        "started_utc": utc_text(started) if started is not None else None,
        "device": _device_json(row.device),
        **sites,
    }


def _device_json(columns: DeviceColumns | None) -> dict[str, Any] | None:
    if columns is None:
        return None
    shaken = columns.last_handshake > 0
    return {
        "role": columns.role,
        "endpoint": columns.endpoint,
        "last_handshake": columns.last_handshake if shaken else None,
        "last_handshake_age": columns.handshake_age,
        "rx_bytes": columns.rx_bytes,
        "tx_bytes": columns.tx_bytes,
    }
