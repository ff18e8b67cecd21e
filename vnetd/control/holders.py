"""Who holds an entry and a public key, and the order of a holder's records, as one
reader has seen them.

``may_rewrite`` is the readers' rule for an entry rewritten in place.
``RecordOrder`` refuses a holder's record that is not after the last one accepted
from it at that rank (a replay: an older record put back, under any lease).
``KeyBindings`` answers a copy of a key: a WireGuard public key is public, and
anyone who can write the registry can put a copy of a member's key under a
free rank. The first *signed* registration of a key binds it to its signing
key; while a member carries the key, and for a grace period after the last
one left (its daemon is claiming again), an entry carrying that key unsigned
or under another signing key is a copy, ordered after every registration (the
key's peer stays its holder's). The why, and what this cannot stop:
docs/architecture.md, "Registry layout".
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping

from vnetd.model import Member


def may_rewrite(old: Member, new: Member) -> bool:
    """Whether ``new`` may replace ``old`` in an entry that was not deleted in between.

    A signed entry changes only under its signing key (a key rotation, a new
    endpoint, a restart within the lease: its holder). An unsigned one, as older
    versions write, keeps the older rule: the same ``instance``, which is public,
    so it is no proof. (A leaseless entry is no member at all: readers skip it,
    so it is never ``old``.)
    """
    if old.signing_key:
        return new.signing_key == old.signing_key
    return new.instance == old.instance


KEYS_ORDERED = 4
"""Signing keys a reader keeps the order of per rank: its holder's and the last ones
that left it (a pod that moved, a rotated signing key); the one accepted least
recently is forgotten first, so memory is bounded by 4 x the ranks."""


class RecordOrder:
    """(rank, signing key) -> the highest ``seq`` accepted and the mod revision of
    the write that carried it.

    etcd's revisions cannot order records: a replay is a new write and gets a new,
    higher revision. The ``seq`` a holder signs can (docs/architecture.md,
    "Registry layout"); a refused one keeps the holder's address its own (invariant
    2). A record of an older version (``seq`` 0) is not ordered
    while its key has written nothing else; once a key wrote a ``seq``, one
    without is older.
    """

    def __init__(self) -> None:
        self._ranks: dict[int, dict[str, tuple[int, int]]] = {}

    def refusal(self, member: Member, mod_revision: int) -> int | None:
        """The highest ``seq`` accepted from ``member``'s signing key at its rank when
        ``member`` is not after it and is not that very write (a re-list or a resumed
        watch brings it again at its own mod revision); else None."""
        if not member.signing_key:
            return None
        seen = self._ranks.get(member.rank, {}).get(member.signing_key)
        if seen is None:
            return None
        highest, revision = seen
        if member.seq > highest or (member.seq == highest and mod_revision == revision):
            return None
        return None if member.seq == highest == 0 else highest

    def knows(self, rank: int, signing_key: str) -> bool:
        """Whether a record of ``signing_key`` was accepted at ``rank`` (its seq is compared)."""
        return signing_key in self._ranks.get(rank, {})

    def highest(self, rank: int, signing_key: str) -> int:
        """The highest ``seq`` accepted from ``signing_key`` at ``rank`` (0: none)."""
        return self._ranks.get(rank, {}).get(signing_key, (0, 0))[0]

    def accept(self, member: Member, mod_revision: int) -> None:
        """``member``, written at ``mod_revision``, was accepted (``refusal`` was None)."""
        if not member.signing_key:
            return
        keys = self._ranks.setdefault(member.rank, {})
        keys.pop(member.signing_key, None)  # the latest last: the oldest goes first
        keys[member.signing_key] = (member.seq, mod_revision)
        if len(keys) > KEYS_ORDERED:
            del keys[next(iter(keys))]

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._ranks.values())


class KeyBindings:
    """Public key -> the signing key that registered it first (bounded by the members
    present plus those that left within ``grace``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.copies: dict[int, str] = {}
        """Rank -> the public key of its entry, refused as a copy of another's key."""
        self._logged: dict[int, int] = {}
        self._signer: dict[str, str] = {}
        self._carriers: dict[str, int] = {}
        self._signers: dict[str, int] = {}
        """Signing key -> how many members in the view carry it (proven or not)."""
        self._until: dict[str, float] = {}
        self._expiring: deque[tuple[float, str]] = deque()

    def owner(self, public_key: str) -> str | None:
        """The signing key ``public_key`` is bound to, or None."""
        self._expire()
        return self._signer.get(public_key)

    def refuses(self, member: Member) -> str | None:
        """The signing key that ``member``'s public key is bound to when it is not
        ``member``'s own (it may not carry that key); else None."""
        bound = self.owner(member.public_key)
        return bound if bound is not None and bound != member.signing_key else None

    def refuse_copy(
        self, member: Member, create_revision: int, members: Mapping[int, Member]
    ) -> tuple[bool, Callable[[], str] | None]:
        """(a copy, its log line the first time for this entry, else None): a copy when
        ``member`` carries a key bound to another signing key; noted in ``copies``. The
        line is a function, so the holder is looked up only for a line that is logged."""
        bound = self.refuses(member)
        if bound is None:
            return False, None
        rank = member.rank
        self.copies[rank] = member.public_key
        if self._logged.get(rank) == create_revision:
            return True, None
        self._logged[rank] = create_revision

        def line() -> str:
            holders = [r for r, m in members.items() if m.public_key == member.public_key]
            return (
                f"rank {rank}'s entry ({member.instance}) copies a public key: "
                f"{member.public_key[:12]} was registered first under signing key "
                f"{bound[:12]}{f' (by rank {holders[0]})' if holders else ''}, and this "
                f"entry is {'signed by another key' if member.signing_key else 'unsigned'}; "
                "it ranks after that holder"
            )

        return True, line

    def bind(self, member: Member) -> None:
        """Bind ``member``'s public key to its signing key, unless it is bound already."""
        if member.signing_key and member.public_key not in self._signer:
            self._signer[member.public_key] = member.signing_key

    def carried(self, member: Member) -> bool:
        """Whether a member in the view carries ``member``'s public key or signing key."""
        return member.public_key in self._carriers or (
            bool(member.signing_key) and member.signing_key in self._signers
        )

    def add(self, member: Member, *, proven: bool = True) -> None:
        """``member`` is in the view now (it was not refused); its key is bound only when
        its proof was verified (``proven``; an unsigned member binds nothing)."""
        key = member.public_key
        self._carriers[key] = self._carriers.get(key, 0) + 1
        if member.signing_key:
            self._signers[member.signing_key] = self._signers.get(member.signing_key, 0) + 1
        self._until.pop(key, None)
        if proven:
            self.bind(member)

    def remove(self, member: Member, grace: float) -> None:
        """``member`` left the view: its key stays bound for ``grace`` s if nobody carries it."""
        key = member.public_key
        signs = self._signers.get(member.signing_key, 0) - 1
        if signs > 0:
            self._signers[member.signing_key] = signs
        else:
            self._signers.pop(member.signing_key, None)
        left = self._carriers.get(key, 0) - 1
        if left > 0:
            self._carriers[key] = left
            return
        self._carriers.pop(key, None)
        if key in self._signer:
            until = self._clock() + grace
            self._until[key] = until
            self._expiring.append((until, key))

    def recount(
        self, members: Iterable[Member], grace: float, unproven: Container[int] = ()
    ) -> None:
        """The view was replaced by ``members`` (a list): carried keys as they are now;
        the ranks in ``unproven`` bind nothing."""
        before = set(self._carriers)
        self._carriers = {}
        self._signers = {}
        for member in members:
            self.add(member, proven=member.rank not in unproven)
        for key in before - set(self._carriers):
            if key in self._signer:
                until = self._clock() + grace
                self._until[key] = until
                self._expiring.append((until, key))

    def __len__(self) -> int:
        return len(self._signer)

    def _expire(self) -> None:
        now = self._clock()
        while self._expiring and self._expiring[0][0] <= now:
            _, key = self._expiring.popleft()
            if key not in self._carriers and self._until.get(key, now + 1) <= now:
                del self._until[key]
                self._signer.pop(key, None)
