"""Who holds an entry and a public key, as one reader has seen them.

``may_rewrite`` is the readers' rule for an entry rewritten in place.
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
from collections.abc import Callable, Iterable, Mapping

from vnetd.model import Member


def may_rewrite(old: Member, old_lease: int, new: Member, new_lease: int) -> bool:
    """Whether ``new`` may replace ``old`` in an entry that was not deleted in between.

    A signed entry changes only under its signing key (a key rotation, a new
    endpoint, a restart within the lease: its holder). An unsigned one, as older
    versions write, keeps the older rule: the same ``instance``, which is public,
    so it is no proof. A leaseless unsigned entry holds no claim: a signed record
    under a lease may replace it (a holder taking its rank back).
    """
    if old.signing_key:
        return new.signing_key == old.signing_key
    if old_lease == 0 and new.signing_key and new_lease:
        return True
    return new.instance == old.instance


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

    def add(self, member: Member) -> None:
        """``member`` is in the view now (it was not refused)."""
        key = member.public_key
        self._carriers[key] = self._carriers.get(key, 0) + 1
        self._until.pop(key, None)
        self.bind(member)

    def remove(self, member: Member, grace: float) -> None:
        """``member`` left the view: its key stays bound for ``grace`` s if nobody carries it."""
        key = member.public_key
        left = self._carriers.get(key, 0) - 1
        if left > 0:
            self._carriers[key] = left
            return
        self._carriers.pop(key, None)
        if key in self._signer:
            until = self._clock() + grace
            self._until[key] = until
            self._expiring.append((until, key))

    def recount(self, members: Iterable[Member], grace: float) -> None:
        """The view was replaced by ``members`` (a list): carried keys as they are now."""
        before = set(self._carriers)
        self._carriers = {}
        for member in members:
            self.add(member)
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
