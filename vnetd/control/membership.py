"""Member records in the registry: the key layout, the codec and the claim.

Layout (docs/architecture.md, "Registry layout")::

    <prefix>/<mesh>/spec            the [mesh] table as canonical JSON, create-if-absent
    <prefix>/<mesh>/members/<rank>  a member record, bound to its daemon's lease

The claim rules: create ``members/<rank>`` if absent; if present and its
``instance`` is ours, the old process is gone and we take it over (a
compare-and-swap on its mod revision); otherwise it is held by someone else
and the caller waits for its deletion.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from vnetd.errors import RegistryError, SpecError, SpecMismatch, VnetdError
from vnetd.model import Member, check_endpoint, check_public_key, is_ascii_number
from vnetd.registry.base import KeyValue, Registry
from vnetd.spec import DEFAULT_SITE, MeshSpec, check_site_name


class BadEntry(VnetdError):
    """A registry entry that cannot be a member; skipped and counted, never fatal."""


ADDRESS_FIELDS = ("address", "addresses", "allowed_ips")
"""Record fields that would name overlay addresses. vnetd never writes them: a
member's addresses come from its rank through the local spec (invariant 1),
so an entry carrying one was not written by vnetd and is refused whole
rather than half-honoured. Other unknown fields are ignored, so that a newer
vnetd can add fields without older daemons dropping its members."""

_KEY_SHOWN = 120
"""Longest key quoted as is in a message; longer or unprintable keys are escaped."""


def mesh_prefix(spec: MeshSpec) -> str:
    return f"{spec.registry.prefix}/{spec.name}/"


def spec_key(spec: MeshSpec) -> str:
    return f"{mesh_prefix(spec)}spec"


def members_prefix(spec: MeshSpec) -> str:
    return f"{mesh_prefix(spec)}members/"


def member_key(spec: MeshSpec, rank: int) -> str:
    return f"{members_prefix(spec)}{rank}"


def encode_member(member: Member) -> bytes:
    """The record's JSON. ``site`` and ``public_endpoint`` are left out at their
    defaults, so a single-site mesh writes exactly what older versions wrote."""
    record = asdict(member)
    if member.site == DEFAULT_SITE:
        del record["site"]
    if member.public_endpoint is None:
        del record["public_endpoint"]
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def rank_of_key(spec: MeshSpec, key: str) -> int | None:
    """The rank a ``members/<rank>`` key names, or None for any other key.

    Only the canonical form counts: ``members/02`` is not rank 2, and only
    ASCII digits are digits (``str.isdigit`` also accepts ``²`` and ``３``).
    """
    suffix = key.removeprefix(members_prefix(spec))
    if suffix == key or not is_ascii_number(suffix):
        return None
    return int(suffix)


def show_key(key: str) -> str:
    """``key`` for a one-line message: escaped when unprintable, cut when long."""
    shown = key if key.isprintable() else ascii(key)
    return shown if len(shown) <= _KEY_SHOWN else f"{shown[:_KEY_SHOWN]}..."


def decode_member(spec: MeshSpec, key: str, value: bytes) -> Member:
    """Parse and check one ``members/<rank>`` entry.

    Raises:
        BadEntry: the message names the key and the field at fault, on one line.
    """
    rank = rank_of_key(spec, key)
    key = show_key(key)
    if rank is None:
        raise BadEntry(f"{key}: not a rank key")
    if rank >= spec.size:
        raise BadEntry(f"{key}: rank {rank} is out of range 0..{spec.size - 1}")
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: RecursionError
        raise BadEntry(f"{key}: value is not JSON") from None
    if not isinstance(record, dict):
        raise BadEntry(f"{key}: value is not a JSON object")
    claimed = record.get("rank")
    if claimed != rank or isinstance(claimed, bool):
        shown = ascii(claimed) if isinstance(claimed, int | float | str | None) else "<object>"
        shown = shown if len(shown) <= 40 else f"{shown[:40]}..."
        raise BadEntry(f"{key}: field rank={shown} does not match the key")
    for field in ADDRESS_FIELDS:
        if field in record:
            raise BadEntry(
                f"{key}: field {field} is not accepted: "
                "a member's address comes from its rank through the spec"
            )
    return Member(
        rank=rank,
        public_key=_public_key(key, record.get("public_key")),
        endpoint=_endpoint(key, record.get("endpoint")),
        instance=_text(key, "instance", record.get("instance"), required=True),
        started=_number(key, "started", record.get("started", 0.0)),
        version=_text(key, "version", record.get("version", ""), required=False),
        device_id=_device_id(key, record.get("device_id", "")),
        site=_site(key, record.get("site", DEFAULT_SITE)),
        public_endpoint=_endpoint(key, record.get("public_endpoint"), "public_endpoint"),
    )


def _site(key: str, value: object) -> str:
    """Optional (absent: the default site): a DNS label."""
    if not isinstance(value, str):
        raise BadEntry(f"{key}: field site is not a string")
    try:
        return check_site_name(value, "field site")
    except SpecError as exc:
        raise BadEntry(f"{key}: {exc}") from None


def _public_key(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise BadEntry(f"{key}: field public_key is missing or not a string")
    return _validated(key, "field public_key ", value, check_public_key)


def _validated(key: str, prefix: str, value: str, check: Callable[[str], str]) -> str:
    """``check(value)``, its ValueError turned into a ``BadEntry`` naming the key."""
    try:
        return check(value)
    except ValueError as exc:
        raise BadEntry(f"{key}: {prefix}{exc}") from None


def _endpoint(key: str, value: object, field: str = "endpoint") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadEntry(f"{key}: field {field} is not a string")
    return _validated(key, f"field {field}: ", value, check_endpoint)


def _text(key: str, field: str, value: object, *, required: bool) -> str:
    if not isinstance(value, str) or (required and not value) or len(value) > 253:
        raise BadEntry(f"{key}: field {field} is missing, empty or not a string")
    if not value.isprintable():  # it is logged ("held by <instance>"): one line
        raise BadEntry(f"{key}: field {field} has unprintable characters")
    return value


DEVICE_ID_MAX = 64
"""Longest ``device_id`` accepted (vnetd writes 16 hex digits)."""


def _device_id(key: str, value: object) -> str:
    """Optional (records of older versions have none): printable ASCII, no spaces, bounded."""
    if not isinstance(value, str) or len(value) > DEVICE_ID_MAX:
        raise BadEntry(
            f"{key}: field device_id is not a string of at most {DEVICE_ID_MAX} characters"
        )
    if not (value.isascii() and value.isprintable()) or " " in value:
        raise BadEntry(f"{key}: field device_id has characters other than printable ASCII")
    return value


def _number(key: str, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadEntry(f"{key}: field {field} is not a number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        number = math.inf
    if not math.isfinite(number):
        raise BadEntry(f"{key}: field {field} is not a finite number")
    return number


async def ensure_spec(registry: Registry, spec: MeshSpec) -> bool:
    """Store the spec if absent; refuse to run if the stored one differs.

    Returns:
        True if this call stored it.

    Raises:
        SpecMismatch: naming the keys that differ.
    """
    existing = await registry.create(spec_key(spec), spec.canonical_json())
    if existing is None:
        return True
    keys = spec.differing_keys(existing.value)
    if keys:
        try:
            stored = json.loads(existing.value)
            detail = ", ".join(
                f"mesh.{k}: registry has {stored.get(k)!r}, local {spec.mesh_table().get(k)!r}"
                for k in keys
            )
        except ValueError:
            detail = "stored spec is not JSON"
        raise SpecMismatch(
            f"the spec stored at {spec_key(spec)} differs from the local one ({detail}); "
            "every daemon of a mesh must use the same [mesh] table"
        )
    return False


@dataclass(frozen=True)
class Claimed:
    took_over: bool


@dataclass(frozen=True)
class Held:
    """The rank is held by another instance."""

    holder: Member | None
    entry: KeyValue


async def try_claim(registry: Registry, spec: MeshSpec, me: Member, lease: int) -> Claimed | Held:
    """One attempt at the claim rules for ``me.rank`` under ``lease``."""
    key = member_key(spec, me.rank)
    value = encode_member(me)
    for _ in range(3):  # a lost compare-and-swap race is retried a few times
        existing = await registry.create(key, value, lease)
        if existing is None:
            return Claimed(took_over=False)
        try:
            holder: Member | None = decode_member(spec, key, existing.value)
        except BadEntry:
            holder = None
        if holder is None or holder.instance != me.instance:
            return Held(holder, existing)
        if await registry.replace(key, value, existing.mod_revision, lease):
            return Claimed(took_over=True)
    raise RegistryError(f"{key}: claim kept losing compare-and-swap races")


async def read_members(registry: Registry, spec: MeshSpec) -> tuple[dict[int, Member], int]:
    """One list of the members (for the CLI): ``({rank: member}, bad entries skipped)``.

    Raises:
        RegistryUnavailable: no etcd endpoint answered.
    """
    kvs, _revision = await registry.list_prefix(members_prefix(spec))
    members: dict[int, Member] = {}
    bad = 0
    for kv in kvs:
        try:
            member = decode_member(spec, kv.key, kv.value)
        except BadEntry:
            bad += 1
            continue
        members[member.rank] = member
    return members, bad
