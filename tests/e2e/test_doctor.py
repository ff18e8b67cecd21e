"""``vnetd doctor`` in the netns lab: real etcd, real wireguard-go, each fault its one cause.

A healthy mesh of 16 reports every pair good (exit 0). A mesh of 7 carries four
faults at once, each on its own ranks, and every ordered pair must get exactly
the cause of the fault on it and no other (exit 1):

- rank 5 never starts: ``not_registered``;
- rank 4's namespace drops UDP to its WireGuard port (nftables, before it
  starts), and rank 4 pings its peers: ``no_handshake``;
- rank 2's namespace drops the inner packets from rank 1 on its WireGuard
  interface (the tunnel stands, the traffic in it does not pass): ``no_data``
  for both directions of that pair;
- rank 3's underlay link has MTU 1400, so outer packets of a full 1420-byte
  inner packet are dropped on the way in with no ICMP back (a path-MTU black
  hole): ``mtu_black_hole``, with the largest size that passes; and each daemon
  that found it has locked its route MTU to rank 3 to that size.

Rank 1's pod drops its inner packets to rank 2 on its way out of its overlay
interface (an nftables output rule): ``no_data`` in rank 1's pod, outbound, for
both directions of that pair, ``ok`` for every other.

Two sites behind NAT routers lose one site's only gateway: ``gateway_hop`` for
every pair across. A pod moves to a new underlay address while one peer has
lost the registry and takes WireGuard only on flows it opened:
``stale_endpoint`` for that pair, ``ok`` for every other.

A registry filled to its quota (etcd's NOSPACE alarm) by a writer of one key:
``registry_full`` for every pair with the rank that could not claim, ``ok`` between
the ranks that were already in the mesh; ``vnetd status`` and the daemon name it too.

The doctor runs in pod 0, as a user in a pod of the mesh would run it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from vnetd.lab.cluster import MeshLab, http_get, log_lines, write_spec
from vnetd.lab.etcd import ETCD_BIN
from vnetd.lab.open_lab import ETCD_IP, ETCD_PORT, open_lab
from vnetd.lab.sites import open_sites_lab
from vnetd.spec import load_spec

DOCTOR_TIMEOUT = 30.0
"""The doctor's own --timeout: its rows take about 1 s when every pair passes, 4.5 s with
a lost echo and 7.3 s with bisection, and a rank that never answers costs its row's 9 s
budget; two passes fit, and the run is bounded by this."""
FORM = 60.0
"""Registrations and peers on every device: seconds each here, WireGuard's retry is 5 s,
but a loaded machine starting 16 Python daemons needs tens of seconds."""


async def doctor(mesh: MeshLab) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "vnetd", "doctor", "--config", str(mesh.spec_path),
            "--json", "--timeout", str(DOCTOR_TIMEOUT)]  # fmt: skip
    start = time.monotonic()
    result = await mesh.lab.run(mesh.pod(0), argv, DOCTOR_TIMEOUT + 15)
    print(f"vnetd doctor: exit {result.returncode} in {time.monotonic() - start:.2f} s")
    print(result.stderr.decode())
    return result.returncode, json.loads(result.stdout), result.stderr.decode()


async def doctor_text(mesh: MeshLab, failing: int) -> str:
    """The table a user reads, printed for docs/operations.md; its last line counts the
    same failing pairs as the JSON."""
    argv = [sys.executable, "-m", "vnetd", "doctor", "--config", str(mesh.spec_path),
            "--timeout", str(DOCTOR_TIMEOUT)]  # fmt: skip
    result = await mesh.lab.run(mesh.pod(0), argv, DOCTOR_TIMEOUT + 15)
    out = result.stdout.decode()
    print(out)
    total = mesh.spec.size * (mesh.spec.size - 1)
    assert out.endswith(f"{failing} of {total} ordered pairs fail\n"), out
    assert result.returncode == 1
    return out


async def wait_formed(mesh: MeshLab, ranks: set[int]) -> None:
    """Until every rank of ``ranks`` is registered and on every other's device."""
    with trio.fail_after(FORM):
        while await mesh.registered_ranks() != ranks:
            await trio.sleep(0.5)
        for rank in sorted(ranks):
            while not ranks - {rank} <= await mesh.device_ranks(rank):
                await trio.sleep(0.5)


async def nft(mesh: MeshLab, rank: int, *commands: str) -> None:
    for command in commands:
        result = await mesh.lab.run(mesh.pod(rank), ["nft", command], 10)
        assert result.returncode == 0, result.stderr.decode()


async def test_a_healthy_mesh_of_16_is_all_good() -> None:
    with trio.fail_after(FORM + DOCTOR_TIMEOUT + 60):
        async with open_lab(16, static_neighbours=True) as lab:
            mesh = MeshLab.create(lab)
            for rank in range(16):
                await mesh.start_rank(rank)
            await wait_formed(mesh, set(range(16)))
            code, doc, _ = await doctor(mesh)
            assert doc["failing"] == [], doc["failing"][:5]
            assert code == 0
            assert doc["ok"] is True
            assert len(doc["working"]) == 16 * 15
            assert {tuple(w[:3]) for w in doc["working"]} == {
                (a, b, None) for a in range(16) for b in range(16) if a != b
            }
            assert all(w[3] is not None and w[4] == 1420 for w in doc["working"])


def expected_cause(a: int, b: int) -> str:
    pair = {a, b}
    if 5 in pair:
        return "not_registered"
    if 4 in pair:
        return "no_handshake"
    if 3 in pair:
        return "mtu_black_hole"
    if pair == {1, 2}:
        return "no_data"
    return "ok"


async def test_each_fault_gets_its_own_cause_and_no_other() -> None:
    with trio.fail_after(FORM + DOCTOR_TIMEOUT + 60):
        async with open_lab(7, static_neighbours=True) as lab:
            mesh = MeshLab.create(lab)
            await nft(
                mesh, 4, "add table inet vdoc",
                "add chain inet vdoc input { type filter hook input priority 0 ; }",
                f"add rule inet vdoc input udp dport {mesh.spec.port} drop",
            )  # fmt: skip
            await nft(
                mesh, 2, "add table inet vdoc",
                "add chain inet vdoc input { type filter hook input priority 0 ; }",
                f'add rule inet vdoc input iifname "{mesh.spec.interface}" '
                f"ip saddr {mesh.address(1)} drop",
            )  # fmt: skip
            mtu = await lab.run(mesh.pod(3), ["ip", "link", "set", "eth0", "mtu", "1400"], 10)
            assert mtu.returncode == 0, mtu.stderr.decode()
            started = {0, 1, 2, 3, 4, 6}
            for rank in sorted(started):
                await mesh.start_rank(rank)
            # Rank 4 is live and sends, as a broker connecting to its peers does: its
            # WireGuard initiates every 5 s, its peers receive that and their answers are
            # dropped. A live rank that sends nothing for WireGuard's 90 s of attempts
            # reads as held_silent instead (docs/security.md names that ambiguity), which
            # a slow formation here reached. One ping a second to each peer, 300 at most;
            # each a process of its own, since ping exits at once while no route exists.
            addresses = " ".join(mesh.address(peer) for peer in sorted(started - {4}))
            pings = (f"for i in $(seq 300); do for a in {addresses}; do "
                     "ping -c 1 -W 1 $a >/dev/null 2>&1 & done; sleep 1; done")  # fmt: skip
            await lab.start(mesh.pod(4), ["sh", "-c", pings], private_mount=False)
            await wait_formed(mesh, started)
            code, doc, _ = await doctor(mesh)
            got = {(f["from"], f["to"]): f["cause"] for f in doc["failing"]}
            got |= {(w[0], w[1]): "ok" for w in doc["working"]}
            want = {(a, b): expected_cause(a, b) for a in range(7) for b in range(7) if a != b}
            wrong = {pair: (got.get(pair), cause) for pair, cause in want.items()
                     if got.get(pair) != cause}  # fmt: skip
            assert not wrong, f"(got, wanted): {wrong}; {doc['failing']}"
            assert code == 1
            await doctor_text(mesh, len(doc["failing"]))
            await doctor_text(mesh, len(doc["failing"]))
            holes = [f for f in doc["failing"] if f["cause"] == "mtu_black_hole"]
            # An outer packet of 1400 bytes carries an inner one of 1340 (60 bytes of
            # WireGuard over IPv4); bisection stops within 8 bytes below what passes.
            assert all(1320 <= f["largest"] <= 1340 for f in holes), holes
            # The black-hole action: each daemon that probed rank 3 locked its route's MTU
            # to what passed, so TCP's MSS follows it; the pairs untouched keep theirs.
            for rank, peer in ((0, 3), (3, 0), (6, 3), (0, 6)):
                shown = await lab.run(mesh.pod(rank), ["ip", "route", "show", mesh.address(peer)])
                route = shown.stdout.decode()
                assert ("mtu lock 13" in route) == (3 in (rank, peer)), (rank, peer, route)
            assert doc["registered"] == sorted(started)


def output_drop(family: str, hook: str, interface: str, address: str) -> list[str]:
    """nft commands that drop what is sent to ``address`` on ``interface``, then the one
    that removes them."""
    device = f' device "{interface}"' if family == "netdev" else ""
    match = "" if family == "netdev" else f'oifname "{interface}" '
    return [
        f"add table {family} vdoc",
        f"add chain {family} vdoc out {{ type filter hook {hook}{device} priority 0 ; }}",
        f"add rule {family} vdoc out {match}ip daddr {address} drop",
        f"delete table {family} vdoc",
    ]


@pytest.mark.parametrize(
    ("family", "hook"),
    [
        # The socket's send fails with EPERM (netfilter's drop on the way out).
        pytest.param("inet", "output", id="output-rule"),
        # The send succeeds and the packet is dropped before the device (no error).
        pytest.param("netdev", "egress", id="egress-rule-silent"),
    ],
)
async def test_an_output_drop_on_a_pods_overlay_interface_is_no_data_in_that_pod(
    family: str, hook: str
) -> None:
    """Rank 1's pod drops its inner packets to rank 2 on their way out of ``vnet0`` (an
    nftables rule, added once the mesh formed): the tunnel stands, rank 2's echoes
    reach rank 1's service, and nothing rank 1 writes to rank 2 reaches its device. Both
    directions of that pair are ``no_data`` in rank 1's pod, outbound; every other pair
    ok. (Before the device's tx count was evidence, both were ``lossy``.)"""
    with trio.fail_after(FORM + DOCTOR_TIMEOUT + 60):
        async with open_lab(3, static_neighbours=True) as lab:
            mesh = MeshLab.create(lab)
            for rank in range(3):
                await mesh.start_rank(rank)
            await wait_formed(mesh, {0, 1, 2})
            *add, remove = output_drop(family, hook, mesh.spec.interface, mesh.address(2))
            try:
                await nft(mesh, 1, *add)
                code, doc, _ = await doctor(mesh)
            finally:
                await lab.run(mesh.pod(1), ["nft", remove], 10)
            got = {(f["from"], f["to"]): f["cause"] for f in doc["failing"]}
            got |= {(w[0], w[1]): "ok" for w in doc["working"]}
            want = {(a, b): "no_data" if {a, b} == {1, 2} else "ok"
                    for a in range(3) for b in range(3) if a != b}  # fmt: skip
            wrong = {pair: (got.get(pair), c) for pair, c in want.items() if got.get(pair) != c}
            assert not wrong, f"(got, wanted): {wrong}; {doc['failing']}"
            assert code == 1
            for failing in doc["failing"]:
                print(failing["detail"])
                assert "dropped in rank 1's pod, on its way out" in failing["detail"], failing


LEASE_GONE = 15.0
"""A killed gateway's entry ends within the lab's lease TTL (5 s) and its peers drop
its routes at once; bound below three TTLs."""


async def test_a_killed_site_gateway_is_named_as_the_hop_that_fails() -> None:
    """Site a (ranks 0-2, gateway 0) and site b (3-5, gateway 3) behind NAT; gateway 3 is
    killed. Pairs with rank 3: not registered; every pair across the sites: the gateway
    hop; inside site b, which the doctor in site a can no longer reach: no answer."""
    with trio.fail_after(FORM + LEASE_GONE + DOCTOR_TIMEOUT + 60):
        async with open_sites_lab({"a": 3, "b": 3}) as lab:
            path = write_spec(lab.workdir / "mesh.toml", 6, lab.etcd_urls, ttl=5)
            with path.open("a") as spec:
                spec.write("\n[sites.a]\ngateways = [0]\n\n[sites.b]\ngateways = [3]\n")
            mesh = MeshLab(lab, path, load_spec(path))
            for gateway in (0, 3):
                pod = mesh.pod(gateway)
                await lab.forward(pod)
                await lab.set_sysctl(pod.netns, "net.ipv4.ip_forward", "1")
                await lab.set_sysctl(pod.netns, "net.ipv4.conf.all.send_redirects", "0")
            for rank in (5, 4, 2, 1, 3, 0):
                pod = mesh.pod(rank)
                flags = ["--site", lab.site(pod).name]
                public = lab.public_endpoint(pod)
                await mesh.start_rank(rank, *flags, *(["--public-endpoint", public] * bool(public)))
            await wait_formed(mesh, set(range(6)))
            await lab.kill_pod(mesh.pod(3))
            with trio.fail_after(LEASE_GONE):
                while 3 in await mesh.registered_ranks() or 4 in await mesh.device_ranks(0):
                    await trio.sleep(0.5)
            code, doc, _ = await doctor(mesh)
            got = {(f["from"], f["to"]): f["cause"] for f in doc["failing"]}
            got |= {(w[0], w[1]): "ok" for w in doc["working"]}

            def cause(a: int, b: int) -> str:
                if 3 in (a, b):
                    return "not_registered"
                if (a < 3) != (b < 3):
                    return "gateway_hop"
                return "ok" if a < 3 else "no_answer"

            want = {(a, b): cause(a, b) for a in range(6) for b in range(6) if a != b}
            wrong = {pair: (got.get(pair), c) for pair, c in want.items() if got.get(pair) != c}
            assert not wrong, f"(got, wanted): {wrong}; {doc['failing']}"
            assert code == 1
            await doctor_text(mesh, len(doc["failing"]))


MOVED_TO = "198.18.2.2"


async def test_a_stale_endpoint_after_a_move_is_named_and_nothing_else() -> None:
    """Rank 2's pod moves to a new underlay address while rank 1's daemon has lost the
    registry (its etcd traffic dropped), so rank 1's device keeps the old endpoint
    (static stability, invariant 5). Rank 1's pod lets WireGuard in only on flows it
    opened (a stateful firewall, as a NAT or a security group without an inbound rule),
    so rank 2's packets from its new address cannot move rank 1's endpoint by roaming
    (invariant 4). Pairs 1 ↔ 2: stale_endpoint; every other pair: ok."""
    with trio.fail_after(2 * FORM + DOCTOR_TIMEOUT + 60):
        async with open_lab(4, static_neighbours=True) as lab:
            mesh = MeshLab.create(lab, ttl=90)  # rank 1's lease outlives the run
            for rank in range(4):
                await mesh.start_rank(rank)
            await wait_formed(mesh, set(range(4)))
            await nft(
                mesh, 1, "add table inet vdoc",
                "add chain inet vdoc input { type filter hook input priority 0 ; }",
                # Both ways: a watch stream already open still delivers inbound.
                f"add rule inet vdoc input ip saddr {ETCD_IP} tcp sport {ETCD_PORT} drop",
                "add rule inet vdoc input ct state established,related accept",
                f"add rule inet vdoc input udp dport {mesh.spec.port} drop",
                "add chain inet vdoc output { type filter hook output priority 0 ; }",
                f"add rule inet vdoc output ip daddr {ETCD_IP} tcp dport {ETCD_PORT} drop",
            )  # fmt: skip
            old = f"{mesh.pod(2).underlay_ip}:{mesh.spec.port}"
            await lab.kill_pod(mesh.pod(2))
            await lab.move_pod(mesh.pod(2), MOVED_TO)
            await mesh.start_rank(2)
            new = f"{MOVED_TO}:{mesh.spec.port}"
            with trio.fail_after(FORM):
                for rank in (0, 3):
                    while (await mesh.device_endpoints(rank)).get(2) != new:
                        await trio.sleep(0.5)
            # Rank 1 opens its flows to the others (its firewall then lets their answers
            # in), rank 2's at the old address: its device still sends there.
            for rank in (0, 2, 3):
                await lab.run(mesh.pod(1), ["ping", "-c", "1", "-W", "2", mesh.address(rank)])
            assert (await mesh.device_endpoints(1))[2] == old
            code, doc, _ = await doctor(mesh)
            got = {(f["from"], f["to"]): f["cause"] for f in doc["failing"]}
            got |= {(w[0], w[1]): "ok" for w in doc["working"]}
            want = {(a, b): "stale_endpoint" if {a, b} == {1, 2} else "ok"
                    for a in range(4) for b in range(4) if a != b}  # fmt: skip
            wrong = {pair: (got.get(pair), c) for pair, c in want.items() if got.get(pair) != c}
            assert not wrong, f"(got, wanted): {wrong}; {doc['failing']}"
            assert code == 1
            stale = [f["detail"] for f in doc["failing"]]
            assert all(f"sends to rank 2 at {old}, the registry has {new}" in d for d in stale)
            await doctor_text(mesh, len(doc["failing"]))


QUOTA = 4 << 20
"""The lab etcd's ``--quota-backend-bytes`` for the full-registry test: small, so the
fill takes a second or two."""
FILL_VALUE, FILL_MAX = 256 << 10, 64
"""The attacker's puts (at most 16 MiB in all: four times the quota, a bounded loop)."""
FILLER = Path(__file__).with_name("quota_filler.py")
HTTP = "127.0.0.1:9100"
"""Rank 2's ``--http-listen``, on its pod's loopback."""


async def etcd_revision(mesh: MeshLab) -> int:
    result = await mesh.lab.etcdctl("endpoint", "status", "-w", "json")
    return int(json.loads(result.stdout)[0]["Status"]["header"]["revision"])


async def test_a_full_registry_is_named_and_the_mesh_keeps_its_peers() -> None:
    """etcd with a 4 MiB quota; ranks 0 and 1 form a mesh; a writer in pod 2 fills the
    quota with puts to one key of its own. Rank 2 then starts and cannot claim (its lease
    grant is refused): its log names it once, its /status, /readyz and /metrics say so,
    ``vnetd doctor`` names ``registry_full`` for every pair with rank 2 and ``vnetd
    status`` a note, while ranks 0 and 1 keep their leases (keepalives pass while full)
    and reach each other. Once space is freed as docs/operations.md says (compact,
    defragment, alarm disarm), rank 2 claims."""
    with trio.fail_after(FORM + 2 * DOCTOR_TIMEOUT + 120):
        async with open_lab(3, with_etcd=False) as lab:
            await lab.start_etcd(extra_flags=("--quota-backend-bytes", str(QUOTA)))
            print(f"etcd: {ETCD_BIN}, quota {QUOTA} B")
            mesh = MeshLab.create(lab)
            for rank in (0, 1):
                await mesh.start_rank(rank)
            await wait_formed(mesh, {0, 1})

            junk = f"{mesh.spec.registry.prefix}/{mesh.spec.name}/junk"
            argv = [sys.executable, str(FILLER), lab.etcd_url, junk, str(FILL_VALUE),
                    str(FILL_MAX)]  # fmt: skip
            fill = await lab.run(mesh.pod(2), argv, 60)
            assert fill.returncode == 0, fill.stderr.decode()
            filled = json.loads(fill.stdout)
            print(f"fill: {filled['puts']} puts of {FILL_VALUE} B in {filled['seconds']} s, "
                  f"then HTTP {filled['status']} {filled['body']}")  # fmt: skip
            assert filled["status"] == 429, filled
            assert filled["body"]["code"] == 8, filled
            assert "database space exceeded" in filled["body"]["message"], filled
            alarms = (await lab.etcdctl("alarm", "list")).stdout.decode()
            assert "NOSPACE" in alarms, alarms

            late = await mesh.start_rank(2, "--http-listen", HTTP)
            await trio.sleep(3 * mesh.spec.registry.lease_ttl)  # leases would have ended
            assert await mesh.registered_ranks() == {0, 1}
            full_lines = [m for _, m in log_lines(late) if m.startswith("registry full")]
            assert len(full_lines) == 1, full_lines  # named once, though retried all along
            assert "database space exceeded" in full_lines[0] and "alarm" in full_lines[0]
            assert await mesh.device_ranks(0) == {1} and await mesh.device_ranks(1) == {0}

            status, body = await http_get(lab, mesh.pod(2), f"http://{HTTP}/status")
            assert status == 200, body
            own = json.loads(body)
            assert own["self"]["claim"] == "claiming", own["self"]
            assert "database space exceeded" in own["self"]["registry_full"], own["self"]
            status, body = await http_get(lab, mesh.pod(2), f"http://{HTTP}/readyz")
            assert status == 503 and "registry full" in body, body
            status, body = await http_get(lab, mesh.pod(2), f"http://{HTTP}/metrics")
            assert "vnetd_registry_full 1.0" in body, body[-2000:]

            code, doc, _ = await doctor(mesh)
            assert code == 1
            causes = {(f["from"], f["to"]): f["cause"] for f in doc["failing"]}
            assert causes == {pair: "registry_full" for pair in ((0, 2), (2, 0), (1, 2), (2, 1))}
            assert {tuple(w[:2]) for w in doc["working"]} == {(0, 1), (1, 0)}
            assert any(n.startswith("registry full") for n in doc["notes"]), doc["notes"]
            print(next(f["detail"] for f in doc["failing"]))
            argv = [sys.executable, "-m", "vnetd", "status", "--config", str(mesh.spec_path),
                    "--json"]  # fmt: skip
            shown = await lab.run(mesh.pod(0), argv, 30)
            assert shown.returncode == 0, shown.stderr.decode()
            document = json.loads(shown.stdout)
            assert document["missing"] == [2]
            notes = [n for n in document["notes"] if n.startswith("registry full")]
            assert notes and "NOSPACE" in notes[0], document["notes"]
            print(notes[0])

            await lab.etcdctl("del", junk)
            await lab.etcdctl("compact", str(await etcd_revision(mesh)))
            await lab.etcdctl("defrag")
            await lab.etcdctl("alarm", "disarm")
            disarmed = time.monotonic()
            with trio.fail_after(FORM):
                while await mesh.registered_ranks() != {0, 1, 2}:
                    await trio.sleep(0.5)
            print(f"rank 2 registered {time.monotonic() - disarmed:.1f} s after the disarm")
            await wait_formed(mesh, {0, 1, 2})
            assert any("registry takes writes again" in m for _, m in log_lines(late))
