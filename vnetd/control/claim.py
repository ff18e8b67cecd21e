"""Hold this rank's claim in the registry for as long as the daemon runs.

A lease of ``lease_ttl`` seconds is kept alive on ``control.renewal``'s schedule
(a third of its TTL, less often in a large mesh at rest; a keepalive with no
answer tried again soon). If the lease is lost (the registry forgot it, or it
expired during an outage) a new one is granted and the rank claimed again; so is
the rank when the synced view shows our entry gone (or only held after a
registry reset). A re-claim also stores the spec again if the registry lost it.
While another instance holds the rank, the claim waits for that entry to go away
and logs the holder once.

The record can change while the claim is held: when wireguard-go is started
again (a new device, with a new device id) the daemon calls ``set_device_id``
once the peers are back on the new device, and the entry is rewritten at
once by the takeover rule (a compare-and-swap on our own entry, under the
same lease), so that peers drop their sessions with the old device. While the
registry is unreachable the rewrite is retried at each keepalive. The same
holds for a new public endpoint (``set_public_endpoint``, from
``control.endpoint_file``: the NAT in front of the member forwards another
port now); peers of other sites then write it (invariant 4: the registry's
endpoint for the rank changed).

Records are signed with ``signer`` (``control.proof``), each with a ``seq`` past
the last (``claim_attempt.next_seq``). The holder also watches its own rank in
the view: an entry rewritten by another writer, without a lease, or with an older
record of ours (refused by readers) is written back with a warning naming what
was found; an entry taken by another holder while our lease
lived is reported as *displaced* (``state``, one log line, a counter) and
waited out like any holder, never fought over; a copy of our public key at
another rank is logged once (docs/architecture.md, "Registry layout").
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Literal

import trio

from vnetd.control.claim_attempt import Claimed, Held, HeldBy, try_claim
from vnetd.control.proof import Signer
from vnetd.control.renewal import RenewalSchedule, renewal_interval
from vnetd.control.retry import Backoff, RegistryHealth, retry_registry
from vnetd.control.spec_check import SpecCheck
from vnetd.control.watcher import MemberView
from vnetd.errors import RegistryError, RegistryUnavailable
from vnetd.model import Member
from vnetd.registry.base import Registry
from vnetd.spec import MeshSpec

log = logging.getLogger("vnetd.claim")

ClaimState = Literal["claiming", "claimed", "waiting", "displaced"]
"""``claiming``: not claimed yet; ``waiting``: another holder has the rank (our
claim was never made, or was lost with our lease); ``displaced``: another
holder took the rank while our lease lived (a forged delete and create, or a
second daemon for this rank)."""


class ClaimHolder:
    """Claims ``me.rank`` and keeps the claim alive."""

    def __init__(
        self,
        registry: Registry,
        spec: MeshSpec,
        me: Member,
        health: RegistryHealth,
        view: MemberView | None = None,
        signer: Signer | None = None,
    ) -> None:
        self.registry = registry
        self.spec = spec
        self.signer = signer
        self.me = replace(me, signing_key=signer.public_key) if signer else me
        self.health = health
        self.view = view
        self.state: ClaimState = "claiming"
        self.holder: str | None = None
        """Who holds the rank while we wait (an instance, or "an unreadable entry")."""
        self.held_by: HeldBy | None = None
        """That entry's instance, signing key, lease and since when (None: not waiting)."""
        self.displaced = 0
        """How many times another holder took the rank while our lease lived."""
        self.restores = 0
        """How many times our entry, overwritten by another writer, was written back."""
        self.spec_check = SpecCheck(registry, spec, lambda: len(view.members) if view else 1)
        self._lost_with_lease = False
        self._restored = 0  # the view's ``overwritten`` revision last answered
        self._copies_logged: set[int] = set()
        self.lease = 0
        self._renewed_at = 0.0
        self.claimed = trio.Event()
        self.claims = 0
        self.claimed_at: float | None = None
        self.record_updates = 0
        self._written: Member | None = None  # the record as last written
        self._seq = 0  # the ``seq`` of the record last written (``claim_attempt.next_seq``)
        self._record_changed = trio.Event()
        self._wake: trio.CancelScope | None = None  # ``_wait``'s, while it waits

    @property
    def ttl(self) -> int:
        return self.spec.registry.lease_ttl

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim, keep alive, and claim again whenever the lease is lost.

        Cancellation: the lease is left as it is; call ``release`` to revoke it.
        """
        task_status.started()
        async with trio.open_nursery() as nursery:
            # Its own task: a read of the spec that waits on a slow etcd member must
            # never delay a keepalive (in ``_keep_alive``'s loop it could cost the lease).
            nursery.start_soon(self.spec_check.run)
            while True:
                await self._claim()
                reason = await self._keep_alive()
                self.claimed = trio.Event()
                self.claimed_at = None
                self.state = "claiming"
                self._lost_with_lease = self.lease != 0
                log.warning("%s; claiming rank %d again", reason, self.me.rank)

    def set_device_id(self, device_id: str) -> None:
        """Our device was started again: register its new id (at once if claimed)."""
        if device_id != self.me.device_id:
            self.me = replace(self.me, device_id=device_id)
            self._record_changed.set()
            if self._wake is not None:
                self._wake.cancel()

    def set_public_endpoint(self, endpoint: str | None) -> None:
        """Where other sites reach us changed: register it (at once if claimed)."""
        if endpoint != self.me.public_endpoint:
            self.me = replace(self.me, public_endpoint=endpoint)
            self._record_changed.set()
            if self._wake is not None:
                self._wake.cancel()

    def set_cert(self, cert: str) -> None:
        """Our rank certificate was renewed: carry it (at once if claimed)."""
        if cert != self.me.cert:
            self.me = replace(self.me, cert=cert)
            self._record_changed.set()
            if self._wake is not None:
                self._wake.cancel()

    async def release(self, timeout: float = 2.0) -> None:  # noqa: ASYNC109 (a bounded cleanup)
        """Revoke the lease so peers drop this rank at once. Bounded; never raises."""
        if not self.lease:
            return
        with trio.move_on_after(timeout) as scope, trio.CancelScope(shield=True):
            try:
                await self.registry.revoke(self.lease)
                log.info("lease revoked; rank %d released", self.me.rank)
            except RegistryError as exc:
                log.warning("could not revoke lease (peers drop us after the TTL): %s", exc)
        if scope.cancelled_caught:
            log.warning("revoking the lease timed out after %.0f s", timeout)
        self.lease = 0

    async def _claim(self) -> None:
        backoff = Backoff()
        waiting_on: tuple[str, str] | None = None
        while True:
            try:
                me, result = await retry_registry("claim", self._try_claim, self.health, backoff)
            except RegistryError as exc:  # e.g. the lease vanished between calls
                log.warning("claim of rank %d refused: %s; retrying", self.me.rank, exc)
                self.lease = 0
                await trio.sleep(backoff.next_delay())
                continue
            if isinstance(result, Claimed):
                self._written, self._seq = me, max(self._seq, result.seq)
                self.claims += 1
                self.claimed_at = time.time()
                self.state, self.holder, self._lost_with_lease = "claimed", None, False
                self.held_by = None
                how = "took over its own entry" if result.took_over else "created the entry"
                if result.replaced:  # a writer's doing, which readers refuse: a warning
                    how = f"took over {result.replaced}"
                log.log(
                    logging.WARNING if result.replaced else logging.INFO,
                    "claimed rank %d as %s (%s, lease %x, ttl %d s)",
                    self.me.rank,
                    self.me.instance,
                    how,
                    self.lease,
                    self.ttl,
                )
                self.claimed.set()
                return
            held_by = HeldBy.of(result, self.held_by, time.time(), self.spec)
            holder, self.held_by = held_by.instance, held_by
            self.holder = holder
            if self._lost_with_lease and self.state != "displaced":
                self.state = "displaced"
                self.displaced += 1
                log.error(
                    "rank %d was taken by %s (lease %x) while our lease %x lived: displaced; "
                    "not ready, waiting for that entry to go",
                    self.me.rank,
                    holder,
                    result.entry.lease,
                    self.lease,
                )
            elif self.state != "displaced":
                self.state = "waiting"
            if (holder, held_by.signing_key) != waiting_on:  # once per holder
                log.warning(
                    "rank %d is held by %s%s; waiting for its lease to end (%s)",
                    self.me.rank,
                    holder,
                    _why_held(result.holder, self.me),
                    held_by.entry(),
                )
                waiting_on = (holder, held_by.signing_key)
            await trio.sleep(min(1.0, self.ttl / 3))

    async def _try_claim(self) -> tuple[Member, Claimed | Held]:
        """One claim attempt with a live lease; the record it wrote and the outcome."""
        await self._fresh_lease()
        if self.claims:  # the registry may have lost the spec (a reset store)
            await self.spec_check.check()
        me = self.me
        return me, await try_claim(
            self.registry, self.spec, me, self.lease, self.signer, after=self._after()
        )

    def _after(self) -> int:
        """The ``seq`` our next record must pass: ours, or one readers took from our key."""
        seen = self.view.order.highest(self.me.rank, self.me.signing_key) if self.view else 0
        return max(self._seq, seen)

    async def _fresh_lease(self) -> None:
        """Make sure ``self.lease`` is alive: a wait on a holder can outlast it."""
        now = trio.current_time()
        if self.lease and now - self._renewed_at > self.ttl / 3:
            if await self.registry.keepalive(self.lease) <= 0:
                self.lease = 0
            self._renewed_at = now
        if not self.lease:
            self.lease = await self.registry.grant(self.ttl)
            self._renewed_at = now

    async def _keep_alive(self) -> str:
        """Keep the lease alive until the claim is lost; returns why it was.

        A changed record (``set_device_id``) is written between renewals, at once.
        Renewals come every third of the TTL, or every ``renewal_interval`` once no
        member changed since the last renewal (``_renewal_interval``); a renewal that
        failed is retried as ``RenewalSchedule`` says.
        """
        lease = self.lease
        schedule = RenewalSchedule(self.ttl, self._renewed_at)  # granted or renewed then
        quiet_since = self._view_version()  # the view as of the last renewal
        seen_own = False  # our entry reached the view since the claim
        while True:
            version = self.view.version if self.view is not None else 0
            await self._wait(schedule.due, version)
            if self._record_changed.is_set():
                self._record_changed = trio.Event()
            if trio.current_time() >= schedule.due:
                started = trio.current_time()
                try:
                    reason = await self._renew(lease)
                except RegistryUnavailable:
                    schedule.failed(started, self._renewed_at)
                else:
                    self._renewed_at = started
                    schedule.renewed(started, self._renewal_interval(quiet_since))
                    quiet_since = self._view_version()
                    if reason is not None:
                        return reason
            elif self.view is not None and self.view.version != version:
                gone = self._entry_gone()
                if seen_own and gone:
                    return f"rank {self.me.rank}'s entry changed in the registry"
                seen_own = seen_own or not gone
            self._report_copies()
            if self._written != self.me or self._overwritten():
                reason = await self._update_record(lease)
                if reason is not None:
                    return reason

    def _view_version(self) -> int:
        return self.view.version if self.view is not None else 0

    def _renewal_interval(self, quiet_since: int) -> float:
        """``renewal_interval`` for the mesh as the view has it when no member changed
        since the view's ``quiet_since`` version (the last renewal), else a third of the
        TTL: a storm, when a loaded etcd or event loop may delay a renewal, keeps the
        wider margin, and the mesh at rest costs etcd fewer requests."""
        if self.view is None or self.view.version != quiet_since:
            return self.ttl / 3
        return renewal_interval(self.ttl, len(self.view.members))

    async def _wait(self, deadline: float, version: int) -> None:
        """Until ``deadline``, a record change, or (with a view) a change of the view.

        One cancel scope, cancelled by ``set_device_id``/``set_public_endpoint``: this
        runs once per batch of watch events, so it opens no nursery and starts no task.
        """
        with trio.move_on_at(deadline) as self._wake:
            try:
                if self._record_changed.is_set():
                    return
                if self.view is not None:
                    await self.view.wait_changed(version)
                else:
                    await trio.sleep_forever()
            finally:
                self._wake = None

    def _overwritten(self) -> bool:
        """True when readers refused a rewrite of our entry we have not answered yet."""
        if self.view is None:
            return False
        revision = self.view.overwritten.get(self.me.rank, 0)
        return revision > self._restored and self._ours() != 0

    def _ours(self) -> int:
        """The create revision of our entry as readers hold it (0: they hold no entry of ours)."""
        if self.view is None:
            return 0
        member = self.view.members.get(self.me.rank)
        if member is None or member.public_key != self.me.public_key:
            return 0
        if member.signing_key != self.me.signing_key:
            return 0
        return self.view.created.get(self.me.rank, 0)

    def _report_copies(self) -> None:
        """Log once each rank whose entry carries our public key (refused or not)."""
        if self.view is None:
            return
        copies = {r for r, key in self.view.bindings.copies.items() if key == self.me.public_key}
        for rank in sorted(copies - self._copies_logged - {self.me.rank}):
            self._copies_logged.add(rank)
            log.warning(
                "rank %d's entry carries our public key (rank %d's): a copy, refused by "
                "readers that saw ours first",
                rank,
                self.me.rank,
            )

    async def _renew(self, lease: int) -> str | None:
        """One keepalive; why the claim is lost, or None.

        Raises:
            RegistryUnavailable: no answer (noted in ``health``).
        """
        try:
            remaining = await self.registry.keepalive(lease)
            self.health.ok()
        except RegistryUnavailable as exc:
            self.health.failed("keepalive", exc)
            raise
        if remaining <= 0:
            self.lease = 0
            return f"lease {lease:x} expired or unknown to the registry"
        if self._entry_gone():
            return f"rank {self.me.rank}'s entry vanished from the registry"
        return None

    async def _update_record(self, lease: int) -> str | None:
        """Rewrite our entry with ``self.me``; why the claim is lost, or None.

        While the registry is unreachable the update waits for the next renewal.
        """
        me, before = self.me, self._written
        overwritten = self.view.overwritten.get(me.rank, 0) if self.view is not None else 0
        try:
            result = await try_claim(
                self.registry, self.spec, me, lease, self.signer, self._ours(), self._after()
            )
            self.health.ok("claim")
        except RegistryUnavailable as exc:
            self.health.failed("claim", exc)
            return None
        except RegistryError as exc:
            return f"rank {me.rank}'s entry could not be updated: {exc}"
        if isinstance(result, Held):
            holder = result.holder.instance if result.holder else "an unreadable entry"
            return f"rank {me.rank}'s entry is held by {holder}"
        self._written, self._seq = me, max(self._seq, result.seq)
        self.record_updates += 1
        if overwritten > self._restored:
            self.restores += 1
            if self.restores == 1 or self.restores % 100 == 0:
                log.warning(
                    "rank %d's entry: found %s, refused by readers; wrote ours back (%d so far)",
                    me.rank,
                    result.replaced or "overwritten by another writer",
                    self.restores,
                )
        self._restored = max(self._restored, overwritten)
        if before is None or before.device_id != me.device_id:
            log.info(
                "rank %d's entry updated: device id %s -> %s (a new wireguard-go)",
                me.rank,
                (before.device_id if before else "") or "none",
                me.device_id or "none",
            )
        if before is not None and before.public_endpoint != me.public_endpoint:
            log.info(
                "rank %d's entry updated: public endpoint %s -> %s",
                me.rank,
                before.public_endpoint or "none",
                me.public_endpoint or "none",
            )
        return None

    def _entry_gone(self) -> bool:
        """True when the synced view shows our entry missing (deleted by hand, or
        the registry lost it while our lease lived on), only held after a reset, or
        replaced by a record not signed by us."""
        if self.view is None or not self.view.synced or self.health.reachable is False:
            return False
        current = self.view.members.get(self.me.rank)
        held = self.me.rank in self.view.held
        if held or current is None or current.public_key != self.me.public_key:
            return True
        return current.signing_key != self.me.signing_key  # a record of someone else's


def _why_held(holder: Member | None, me: Member) -> str:
    """A note on why the holder is not us when it carries our instance."""
    if holder is None or holder.instance != me.instance:
        return ""
    return " (our instance under another signing key: a second daemon for this rank?)"
