"""``vnetd register``: a rank held for a plain WireGuard host, on MemoryRegistry.

The daemons add the registered host as a peer at its rank's address and the
registered endpoint; stopping the command revokes the lease and the peer goes.
"""

from __future__ import annotations

import base64

import pytest
import trio
import trio.testing
from test_daemon import Cluster

from vnetd.cli import build_parser
from vnetd.errors import VnetdError
from vnetd.register import hold_claim, member_of

HOST_KEY = base64.b64encode(b"h" * 32).decode()


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def args(tmp_path, *extra: str):
    return build_parser().parse_args(["register", "--config", str(tmp_path / "mesh.toml"), *extra])


async def test_registered_host_becomes_a_peer_until_stopped(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        r0 = await cluster.start(0)
        parsed = args(tmp_path, "--rank", "2", "--public-key", HOST_KEY,
                      "--endpoint", "198.18.7.7:51820", "--instance", "laptop")  # fmt: skip
        me = member_of(parsed, r0.spec, {})
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
