"""Member records in the registry: the key layout and the codec.

Layout (docs/architecture.md, "Registry layout")::

    <prefix>/<mesh>/spec            the [mesh] table as canonical JSON, create-if-absent
    <prefix>/<mesh>/members/<rank>  a member record, bound to its daemon's lease

Records are signed (``control.proof``) and ``decode_member`` checks the proof; a
reader takes an entry bound to no lease for no member. One attempt at the claim
rules is ``control.claim_attempt.try_claim``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict

from vnetd.control import rank_cert
from vnetd.control.proof import Signer, verify
from vnetd.errors import IdentityError, SpecError, SpecMismatch, VnetdError
from vnetd.model import Member, check_public_key, is_ascii_number, parse_endpoint
from vnetd.model import check_endpoint as check_endpoint  # the codec's rules, re-exported
from vnetd.registry.base import Registry
from vnetd.registry.bounds import dropped_size
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


def encode_member(
    member: Member, signer: Signer | None = None, *, key: str = "", lease: int = 0
) -> bytes:
    """The record's JSON. ``site``, ``public_endpoint`` and ``signing_key`` are left
    out at their defaults, so an unsigned single-site record is exactly what older
    versions wrote. With ``signer`` (whose key is ``member.signing_key``) the record
    carries ``proof``: its signature of the rest, at registry ``key`` under ``lease``.

    Raises:
        ValueError: ``member.signing_key`` is not ``signer``'s (or there is no signer).
    """
    record = asdict(member)
    if member.site == DEFAULT_SITE:
        del record["site"]
    if member.public_endpoint is None:
        del record["public_endpoint"]
    for field in ("signing_key", "cert"):
        if not record[field]:
            del record[field]
    if not member.signing_key or not member.seq:  # only a proof makes an order
        del record["seq"]
    body = _canonical(record)
    if signer is None and not member.signing_key:
        return body
    if signer is None or signer.public_key != member.signing_key:
        raise ValueError("a record with a signing_key is written by that key's signer")
    record["proof"] = signer.sign(key, lease, body)
    return _canonical(record)


def _canonical(record: dict[str, object]) -> bytes:
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


def decode_member(
    spec: MeshSpec,
    key: str,
    value: bytes,
    lease: int = 0,
    *,
    proven: bool = False,
    leased: bool = False,
) -> Member:
    """Parse and check one ``members/<rank>`` entry, bound to ``lease`` (0: none).

    A signed record's proof must verify for this key and lease; ``proven``: the
    caller verified these very bytes at this key and lease before (a re-list).
    ``leased``: a reader's rule, an entry bound to no lease is no member, whatever
    its signature (every claim is bound to its holder's lease; no daemon writes one).

    Raises:
        BadEntry: the message names the key and the field at fault, on one line.
    """
    rank = rank_of_key(spec, key)
    raw_key, key = key, show_key(key)
    if rank is None:
        raise BadEntry(f"{key}: not a rank key")
    size = dropped_size(value)
    if size is not None:
        raise BadEntry(f"{key}: a value of {size} bytes, far over what a member record holds")
    if rank >= spec.size:
        raise BadEntry(f"{key}: rank {rank} is out of range 0..{spec.size - 1}")
    if leased and lease == 0:
        raise BadEntry(
            f"{key}: no lease: every claim is bound to its holder's lease, so a leaseless "
            "entry is no member (its rank's daemon takes it over)"
        )
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
    fields = {  # checked in this order, the proof last: its message names the field at fault
        "public_key": _public_key(key, record.get("public_key")),
        "endpoint": _endpoint(key, record.get("endpoint"), spec=spec),
        "instance": _text(key, "instance", record.get("instance"), required=True),
        "started": _number(key, "started", record.get("started", 0.0)),
        "version": _text(key, "version", record.get("version", ""), required=False),
        "device_id": _device_id(key, record.get("device_id", "")),
        "site": _site(key, record.get("site", DEFAULT_SITE)),
        "public_endpoint": _endpoint(
            key, record.get("public_endpoint"), "public_endpoint", spec=spec
        ),
    }
    fields["cert"] = cert = _cert(key, record.get("cert", ""))
    refused = rank_cert.refusal(spec, rank, record.get("signing_key"), cert)
    if refused is not None:  # before the proof: a certificate seen before costs a lookup
        raise BadEntry(f"{key}: {refused}")
    seq = _seq(key, record.get("seq", 0))
    signing_key = _proven_signer(key, raw_key, record, lease, proven)
    _check_pin(spec, key, rank, signing_key)
    return Member(rank=rank, **fields, signing_key=signing_key,  # type: ignore[arg-type]
                  seq=seq if signing_key else 0)  # fmt: skip


def check_proof(key: str, value: bytes, lease: int) -> None:
    """Verify the proof of ``value``, a record ``decode_member`` took with ``proven``.

    Raises:
        BadEntry: its proof does not verify for ``key`` and ``lease``.
    """
    record = json.loads(value)
    _proven_signer(show_key(key), key, record, lease, False)


def _check_pin(spec: MeshSpec, key: str, rank: int, signing_key: str) -> None:
    """A gateway rank whose signing key the spec pins takes records signed by that key
    alone: a free gateway rank carries its site's cross-site routes (``mesh.gateways``)."""
    pinned = spec.pinned_key(rank)
    if pinned is None or signing_key == pinned:
        return
    site = spec.site_of_gateway(rank)
    how = f"signed by {signing_key[:12]!r}" if signing_key else "unsigned"
    raise BadEntry(
        f"{key}: rank {rank} is a gateway whose signing key is pinned to {pinned[:12]!r} "
        f"(sites.{site}.gateway_keys.{rank}), and this entry is {how}: not its gateway"
    )


def check_pinned_signer(spec: MeshSpec, rank: int, signing_key: str, source: str) -> None:
    """Refuse to claim a pinned gateway rank with another signing key (readers would
    skip every record of ours).

    Args:
        signing_key: ours ("" : we sign nothing).
        source: where our key comes from, for the message (``DIR/signing.key``,
            ``--signing-key-file FILE``).

    Raises:
        IdentityError: naming the pin and the fix.
    """
    pinned = spec.pinned_key(rank)
    if pinned is None or signing_key == pinned:
        return
    site = spec.site_of_gateway(rank)
    ours = f"this signing key ({source}) is {signing_key[:12]!r}" if signing_key else (
        f"this claim would be unsigned ({source})")  # fmt: skip
    raise IdentityError(
        f"rank {rank}: sites.{site}.gateway_keys.{rank} pins its signing key to "
        f"{pinned[:12]!r}, and {ours}; run the gateway with the pinned key (the state dir "
        "that holds it, or --signing-key-file FILE), or pin this one (`vnetd signing-key "
        "--state-dir DIR` prints it)"
    )


def _proven_signer(
    key: str, raw_key: str, record: dict[str, object], lease: int, proven: bool
) -> str:
    """The record's ``signing_key`` once its ``proof`` verifies; "" for an unsigned record."""
    signing_key, proof = record.get("signing_key"), record.get("proof")
    if signing_key is None and proof is None:
        return ""
    if not isinstance(signing_key, str) or not isinstance(proof, str):
        raise BadEntry(f"{key}: fields signing_key and proof go together, as strings")
    if proven:
        return signing_key
    body = {field: value for field, value in record.items() if field != "proof"}
    if not verify(signing_key, proof, raw_key, lease, _canonical(body)):
        raise BadEntry(
            f"{key}: field proof does not verify under lease {lease:x}: not written by "
            f"the holder of signing key {signing_key[:12]!r} for this key and lease"
        )
    return signing_key


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


def _endpoint(key: str, value: object, field: str = "endpoint", *, spec: MeshSpec) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadEntry(f"{key}: field {field} is not a string")
    try:
        endpoint, host = parse_endpoint(value)
    except ValueError as exc:
        raise BadEntry(f"{key}: field {field}: {exc}") from None
    for network in spec.networks:
        if host.version == network.version and host in network:
            raise BadEntry(
                f"{key}: field {field}: {endpoint} is inside the overlay network {network}; "
                "an endpoint is an underlay address"
            )
    return endpoint


def _text(key: str, field: str, value: object, *, required: bool) -> str:
    if not isinstance(value, str) or (required and not value) or len(value) > 253:
        raise BadEntry(f"{key}: field {field} is missing, empty or not a string")
    if not value.isprintable():  # it is logged ("held by <instance>"): one line
        raise BadEntry(f"{key}: field {field} has unprintable characters")
    return value


def _cert(key: str, value: object) -> str:
    """Optional: a rank certificate, base64, bounded (``control.rank_cert``)."""
    if not isinstance(value, str) or len(value) > rank_cert.CERT_MAX:
        raise BadEntry(f"{key}: field cert is not a string of at most {rank_cert.CERT_MAX} "
                       "characters")  # fmt: skip
    return value


SEQ_MAX = (1 << 63) - 1
"""Largest ``seq`` accepted (a signed 64-bit integer, as ``time.time_ns`` gives)."""


def _seq(key: str, value: object) -> int:
    """Optional (records of older versions have none: 0): an integer 0..``SEQ_MAX``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEQ_MAX:
        raise BadEntry(f"{key}: field seq is not an integer from 0 to {SEQ_MAX}")
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
    # Read first: a site or rank credential may only read the spec (docs/security.md),
    # and etcd checks a transaction's put even when its compare fails.
    existing = await registry.get(spec_key(spec))
    if existing is None:
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


def describe(holder: Member | None) -> str:
    """Who wrote an entry, for a log line: its instance and signing key's first characters."""
    if holder is None:
        return "an unreadable record"
    signed = f"signing key {holder.signing_key[:12]}" if holder.signing_key else "unsigned"
    return f"instance {holder.instance}, {signed}"


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
            member = decode_member(spec, kv.key, kv.value, kv.lease, leased=True)
        except BadEntry:
            bad += 1
            continue
        members[member.rank] = member
    return members, bad
