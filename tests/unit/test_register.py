"""``vnetd register``: a rank held for a plain WireGuard host, on MemoryRegistry.

The daemons add the registered host as a peer at its rank's address and the
registered endpoint; stopping the command revokes the lease and the peer goes.
"""

from __future__ import annotations

import base64
import logging

import pytest
import trio
import trio.testing
from test_daemon import Cluster

from vnetd.cli import build_parser
from vnetd.commands.register import hold_claim, member_of
from vnetd.errors import VnetdError

HOST_KEY = base64.b64encode(b"h" * 32).decode()


def args(tmp_path, *extra: str):
    return build_parser().parse_args(["register", "--config", str(tmp_path / "mesh.toml"), *extra])


async def laptop_at_rank_2(cluster: Cluster, tmp_path):
    """Rank 0 started in ``cluster``; the record ``register`` makes for a laptop at rank 2."""
    r0 = await cluster.start(0)
    parsed = args(tmp_path, "--rank", "2", "--public-key", HOST_KEY,
                  "--endpoint", "198.18.7.7:51820", "--instance", "laptop")  # fmt: skip
    return r0, member_of(parsed, r0.spec, {})


async def test_registered_host_becomes_a_peer_until_stopped(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0, me = await laptop_at_rank_2(cluster, tmp_path)
        scope = trio.CancelScope()
        nursery.start_soon(_hold, cluster, r0.spec, me, scope)
        await cluster.wait_full(["pod0"], {0, 2})
        peer = cluster.devices["pod0"].device[HOST_KEY]
        assert (peer.endpoint, peer.allowed_ips) == ("198.18.7.7:51820", ("10.250.0.3/32",))
        await trio.sleep(60)  # several lease TTLs: the claim is kept alive
        assert cluster.peer_ranks("pod0") == {2}
        scope.cancel()
        with trio.fail_after(2):  # revoked, not left to expire (TTL 10 s)
            while cluster.peer_ranks("pod0"):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def _hold(cluster: Cluster, spec, me, scope: trio.CancelScope) -> None:
    with scope:
        await hold_claim(cluster.registry, spec, me)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rank", "9", "--public-key", HOST_KEY, "--endpoint", "1.2.3.4:5"], "out of range"),
        (["--rank", "1", "--public-key", "abc", "--endpoint", "1.2.3.4:5"], "--public-key"),
        (["--rank", "1", "--public-key", HOST_KEY, "--endpoint", "x"], "--endpoint"),
        (["--rank", "1", "--public-key", HOST_KEY, "--endpoint", "1.2.3.4:5", "--site", "B"],
         "--site"),
    ],
)  # fmt: skip
def test_bad_flags_are_named(tmp_path, extra, message):
    from test_daemon import SPEC

    from vnetd.spec import load_spec

    (tmp_path / "mesh.toml").write_text(SPEC.format(size=4))
    parsed = args(tmp_path, *extra)
    with pytest.raises(VnetdError, match=message):
        member_of(parsed, load_spec(tmp_path / "mesh.toml"), {})


def test_site_and_public_endpoint_are_registered(tmp_path):
    from test_daemon import SPEC

    from vnetd.spec import load_spec

    (tmp_path / "mesh.toml").write_text(SPEC.format(size=4))
    parsed = args(tmp_path, "--rank", "3", "--public-key", HOST_KEY, "--endpoint",
                  "10.0.0.3:51820", "--site", "b", "--public-endpoint", "203.0.113.5:40000")  # fmt: skip
    me = member_of(parsed, load_spec(tmp_path / "mesh.toml"), {})
    assert (me.rank, me.site, me.public_endpoint) == (3, "b", "203.0.113.5:40000")


async def test_public_endpoint_file_is_followed(tmp_path, caplog, monkeypatch):
    """Real time (the file is read in a worker thread): polled every 50 ms here."""
    caplog.set_level(logging.INFO, logger="vnetd.claim")
    monkeypatch.setattr("vnetd.control.endpoint_file.PUBLIC_ENDPOINT_POLL", 0.05)
    """A new public endpoint in the file rewrites our entry under the same lease."""
    from vnetd.control.claim import ClaimHolder
    from vnetd.control.endpoint_file import follow_public_endpoint
    from vnetd.control.membership import decode_member, member_key
    from vnetd.control.retry import RegistryHealth
    from vnetd.model import Member
    from vnetd.registry.memory import MemoryRegistry
    from vnetd.spec import parse_spec

    spec = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.250.0.0/16"}})
    registry = MemoryRegistry()
    me = Member(1, HOST_KEY, "10.1.0.10:51820", "pod1", 1.0, "v", "", "a", "198.18.0.1:40001")
    path = tmp_path / "public"
    path.write_text("198.18.0.1:40001\n")
    claim = ClaimHolder(registry, spec, me, RegistryHealth())

    async def registered() -> Member:
        entry = await registry.get(member_key(spec, 1))
        assert entry is not None
        return decode_member(spec, entry.key, entry.value, entry.lease)

    async def until_public(value: str | None) -> None:
        with trio.fail_after(5):
            while (await registered()).public_endpoint != value:
                await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        await nursery.start(claim.run)
        nursery.start_soon(follow_public_endpoint, path, claim)
        lease = claim.lease
        path.write_text("198.18.0.1:41001\n")
        await until_public("198.18.0.1:41001")
        path.write_text("not an endpoint")
        await trio.sleep(0.5)
        assert (await registered()).public_endpoint == "198.18.0.1:41001"
        warnings = [
            r.getMessage() for r in caplog.records if "public endpoint file" in r.getMessage()
        ]
        assert len(warnings) == 1 and "keeping 198.18.0.1:41001" in warnings[0]
        path.write_text("")
        await until_public(None)
        assert claim.lease == lease and claim.claims == 1
        assert "rank 1's entry updated: public endpoint 198.18.0.1:41001 -> none" in caplog.text
        nursery.cancel_scope.cancel()


async def test_register_follows_a_public_endpoint_file_like_up(tmp_path, monkeypatch):
    """Real time (the file is read in a worker thread): polled every 50 ms here."""
    from test_daemon import SPEC

    from vnetd.control.membership import decode_member, member_key
    from vnetd.registry.memory import MemoryRegistry
    from vnetd.spec import load_spec

    monkeypatch.setattr("vnetd.control.endpoint_file.PUBLIC_ENDPOINT_POLL", 0.05)
    (tmp_path / "mesh.toml").write_text(SPEC.format(size=4))
    spec = load_spec(tmp_path / "mesh.toml")
    path = tmp_path / "public"
    path.write_text("203.0.113.5:40000\n")
    parsed = args(tmp_path, "--rank", "3", "--public-key", HOST_KEY, "--endpoint",
                  "10.0.0.3:51820", "--site", "b", "--public-endpoint-file", str(path))  # fmt: skip
    me = member_of(parsed, spec, {"VNETD_PUBLIC_ENDPOINT": "198.51.100.1:1"})
    assert me.public_endpoint == "203.0.113.5:40000", "the file is the only source"
    registry = MemoryRegistry()

    async def public() -> str | None:
        entry = await registry.get(member_key(spec, 3))
        return (
            None
            if entry is None
            else decode_member(spec, entry.key, entry.value, entry.lease).public_endpoint
        )

    async def until_public(value: str | None) -> None:
        with trio.fail_after(5):
            while await public() != value:
                await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold_claim, registry, spec, me, parsed.public_endpoint_file)
        await until_public("203.0.113.5:40000")
        path.write_text("203.0.113.5:41000\n")
        await until_public("203.0.113.5:41000")
        path.write_text("")
        await until_public(None)
        nursery.cancel_scope.cancel()
    assert await registry.get(member_key(spec, 3)) is None, "the lease is revoked on the way out"


def test_an_unreadable_public_endpoint_file_is_named(tmp_path):
    from test_daemon import SPEC

    from vnetd.spec import load_spec

    (tmp_path / "mesh.toml").write_text(SPEC.format(size=4))
    parsed = args(tmp_path, "--rank", "1", "--public-key", HOST_KEY, "--endpoint", "1.2.3.4:5",
                  "--public-endpoint-file", str(tmp_path / "absent"))  # fmt: skip
    with pytest.raises(VnetdError, match="--public-endpoint-file .*absent"):
        member_of(parsed, load_spec(tmp_path / "mesh.toml"), {})


@pytest.mark.parametrize("keep_key", [True, False], ids=["state-dir", "unsigned"])
async def test_a_restarted_register_is_read_as_the_same_holder(tmp_path, autojump_clock, keep_key):
    from vnetd.commands.register import signer_in
    from vnetd.control.retry import RegistryHealth
    from vnetd.control.watcher import MemberView, sync_members

    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0, me = await laptop_at_rank_2(cluster, tmp_path)
        view = MemberView()
        await nursery.start(sync_members, cluster.registry, r0.spec, view, RegistryHealth())
        signing_keys = []
        for _ in range(2):  # the second run comes back at once, within the key's grace
            signer = signer_in(tmp_path / "register-state") if keep_key else None
            scope = trio.CancelScope()
            nursery.start_soon(_hold_signed, cluster, r0.spec, me, scope, signer)
            with trio.fail_after(5):
                while 2 not in view.members:
                    await trio.sleep(0.05)
            signing_keys.append(view.members[2].signing_key)
            scope.cancel()
            with trio.fail_after(2):
                while 2 in view.members:
                    await trio.sleep(0.05)
        assert view.bindings.copies == {}
        assert signing_keys[0] == signing_keys[1]
        assert bool(signing_keys[0]) is keep_key
        nursery.cancel_scope.cancel()


async def _hold_signed(cluster: Cluster, spec, me, scope: trio.CancelScope, signer) -> None:
    with scope:
        await hold_claim(cluster.registry, spec, me, None, signer)
