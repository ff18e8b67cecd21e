"""A claim that waits on a kept-alive lease reports who holds the rank, and acts on nothing.

The holder is "killed" without a revoke (a SIGKILL), and the test keeps its lease alive,
as a client with etcd's keepalive would (any client on etcd 3.4.23 and 3.5.1; on 3.5.28
and later one that may put the entry's key). The rank's new daemon (another instance)
waits, and its ``/status`` ``self.held_by``, ``vnetd_claim_held_seconds`` and one log
line name the entry; once the keeper stops, the lease ends and the new daemon claims.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
import trio
from test_daemon import Cluster

from vnetd.control import rank_cert
from vnetd.control.claim_attempt import Held, HeldBy
from vnetd.control.membership import member_key
from vnetd.control.proof import Signer
from vnetd.model import Member
from vnetd.observe.endpoints import DaemonEndpoints
from vnetd.observe.metrics import DaemonMetrics
from vnetd.registry.base import KeyValue
from vnetd.spec import load_spec, parse_spec


def held_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rank 1 is held by" in r.getMessage()]


async def test_a_claim_waiting_on_a_kept_alive_lease_reports_its_holder(
    tmp_path: Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        first = await cluster.start(1, instance="pod-a")
        with trio.fail_after(10):
            await first.claim.claimed.wait()
        lease, key = first.claim.lease, first.claim.me.signing_key
        first.claim.lease = 0  # a SIGKILL: the daemon revokes nothing
        cluster.stop("pod-a")
        keeper = trio.CancelScope()

        async def keep_alive() -> None:
            with keeper:
                while True:
                    assert await cluster.registry.keepalive(lease) > 0
                    await trio.sleep(1)

        nursery.start_soon(keep_alive)
        second = await cluster.start(1, instance="pod-b")
        endpoints = DaemonEndpoints(second.spec, second.me, DaemonMetrics())
        endpoints.attach(second)
        await trio.sleep(5)
        held = (await endpoints.status())["self"]["held_by"]
        assert second.claim.state == "waiting"
        assert held is not None
        assert (held["instance"], held["signing_key"], held["lease"]) == (
            "pod-a",
            key[:12],
            f"{lease:x}",
        )
        assert held["held_for_s"] >= 0 and held["holder"] is None  # no rank CA: no certificate
        since = held["since"]

        await trio.sleep(60)  # ten lease TTLs: the kept-alive lease outlives them all
        assert second.claim.state == "waiting"
        held = (await endpoints.status())["self"]["held_by"]
        assert held is not None and held["since"] == since  # kept while that entry holds
        metrics = (await endpoints.metrics()).decode()
        labels = f'instance="pod-a",lease="{lease:x}",signing_key="{key[:12]}"'
        assert f"vnetd_claim_held_seconds{{{labels}}}" in metrics
        lines = held_lines(caplog)
        assert len(lines) == 1, lines  # once, not at every retry
        assert f"lease {lease:x}" in lines[0] and f"signing key {key[:12]}" in lines[0]
        ready = await endpoints.ready()
        assert not ready.ok and "rank 1 is held by pod-a" in ready.detail

        keeper.cancel()  # reported, never acted on: only the lease's end frees the rank
        with trio.fail_after(2 * second.spec.registry.lease_ttl):
            await second.claim.claimed.wait()
        assert (await endpoints.status())["self"]["held_by"] is None
        assert "vnetd_claim_held_seconds{" not in (await endpoints.metrics()).decode()
        entry = await cluster.registry.get(member_key(second.spec, 1))
        assert entry is not None and b'"instance":"pod-b"' in entry.value
        nursery.cancel_scope.cancel()


def held(instance: str, signing_key: str, lease: int) -> Held:
    member = Member(1, "A" * 43 + "=", None, instance, signing_key=signing_key)
    return Held(member, KeyValue("k", b"v", 1, 1, lease))


@pytest.mark.parametrize(
    ("after", "kept"),
    [
        pytest.param(held("pod-a", "K" * 44, 7), True, id="same-entry-keeps-since"),
        pytest.param(held("pod-a", "K" * 44, 8), False, id="a-new-lease-is-a-new-holding"),
        pytest.param(held("pod-c", "K" * 44, 7), False, id="another-instance"),
        pytest.param(held("pod-a", "J" * 44, 7), False, id="another-signing-key"),
    ],
)
def test_held_by_keeps_since_only_while_the_same_entry_holds(
    tmp_path: Path, after: Held, kept: bool
) -> None:
    (tmp_path / "mesh.toml").write_text(
        '[mesh]\nname = "unit"\nsize = 4\nnetwork = "10.250.0.0/16"\n'
    )
    spec = load_spec(tmp_path / "mesh.toml")
    before = HeldBy.of(held("pod-a", "K" * 44, 7), None, 100.0, spec)
    assert before.as_json(130.0)["held_for_s"] == 30.0
    now = HeldBy.of(after, before, 200.0, spec)
    assert (now.since == 100.0) is kept
    unreadable = HeldBy.of(Held(None, KeyValue("k", b"v", 1, 1, 9)), before, 200.0, spec)
    assert (unreadable.instance, unreadable.signing_key, unreadable.since) == (
        "an unreadable entry",
        "",
        200.0,
    )


def test_held_by_names_the_pod_its_rank_certificate_names_where_a_rank_ca_is_pinned() -> None:
    ca, holder = Signer.generate(), Signer.generate()
    mesh: dict[str, object] = {"name": "m", "size": 4, "network": "10.0.0.0/24"}
    pinned = parse_spec({"mesh": {**mesh, "rank_ca": [ca.public_key]}})
    uri = "vnetd://m/flux/m-1-abcde/0f3c-uid-old"
    cert = base64.b64encode(rank_cert.issue(ca, holder.public_key, uri, days=1)).decode()
    member = Member(1, "A" * 43 + "=", None, "m-1-abcde", signing_key=holder.public_key, cert=cert)
    entry = Held(member, KeyValue("k", b"v", 1, 1, 0x7F))
    named = HeldBy.of(entry, None, 100.0, pinned)
    assert named.holder == "pod flux/m-1-abcde (uid 0f3c-uid-old)"
    assert named.entry() == f"signing key {holder.public_key[:12]}…, lease 7f, {named.holder}"
    assert named.as_json(100.0)["holder"] == named.holder
    assert HeldBy.of(entry, None, 100.0, parse_spec({"mesh": mesh})).holder == ""  # no CA
    other = parse_spec({"mesh": {**mesh, "rank_ca": [Signer.generate().public_key]}})
    assert HeldBy.of(entry, None, 100.0, other).holder == ""  # a CA that did not sign it
