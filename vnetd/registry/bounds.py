"""What a registry read keeps of an entry: bounded keys and values (docs/architecture.md,
"Bounded reads").

A member key is short (``<prefix>/<mesh>/members/<rank>``) and a member record well
under a kilobyte, but etcd accepts keys and values up to its request limit (1.5 MiB
by default), and one writer can fill a prefix with them. Every read (a list, a
watch event, a get) keeps at most ``MAX_KEY_KEPT`` characters of a key and
``MAX_VALUE_KEPT`` bytes of a value: a longer key is cut and tagged with a digest of
the whole (so the same key is named the same way by a list and by its delete
event), a longer value becomes a short marker that says how long it was, which the
member codec refuses as too large. Both implementations of ``Registry`` apply it,
so the contract suite checks it on both.
"""

from __future__ import annotations

import hashlib

MAX_KEY_KEPT = 1024
"""Characters of a key kept; a longer key cannot be a member's (nor the spec's)."""
MAX_VALUE_KEPT = 64 * 1024
"""Bytes of a value kept; a member record or a spec is far smaller."""
_CUT_KEY_HEAD = 256
_OVERSIZED = b"\x00vnetd: value not kept: "


def kept_key(key: str) -> str:
    """``key``, or its first characters and a digest of it when it is over the bound."""
    if len(key) <= MAX_KEY_KEPT:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{key[:_CUT_KEY_HEAD]}...[{len(key)} characters, sha256 {digest}]"


def kept_value(value: bytes) -> bytes:
    """``value``, or a marker naming its size when it is over the bound."""
    if len(value) <= MAX_VALUE_KEPT:
        return value
    return _OVERSIZED + str(len(value)).encode()


def dropped_size(value: bytes) -> int | None:
    """The size of the value ``kept_value`` replaced by its marker; None for a kept value."""
    if not value.startswith(_OVERSIZED):
        return None
    return int(value[len(_OVERSIZED) :])
