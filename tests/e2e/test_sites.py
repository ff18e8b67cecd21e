"""Two sites behind NAT routers (``vnetd.lab.sites``), real etcd and wireguard-go.

The lab's isolation is asserted first (a test that the tests' premise holds),
then the scenarios of docs/architecture.md, "Sites": (a) every member has its
own forwarded port and the mesh forms across sites in any start order; (b) only
one gateway per site is forwarded and every pair reaches the other through the
gateways, and ``vnetd wait --reachable`` opens in a pod of each site; (c) site b loses one of its two gateways and cross-site traffic
resumes after a bounded pause; (d) a member's NAT mapping changes under it and
traffic resumes without a restart.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import trio
from test_flux_overlay import HELLO_WITHIN, hellos, render_bootstrap, start_broker, wait_until
from test_wait import text, vnetd_wait

from vnetd.lab.cluster import MeshLab, write_spec
from vnetd.lab.open_lab import ETCD_IP, Pod
from vnetd.lab.sites import SitesLab, open_sites_lab
from vnetd.spec import load_spec

FULL_MESH_BOUND = 20.0
"""(a): from the last start to every cross-site pair reached. Below the 4 x 5 s of a
handshake retried at each WireGuard retry interval; measured 0.5-2.1 s in 20 runs here,
with one outlier of 14.7 s (printed, with the slowest pairs)."""
WAIT_BOUND = FULL_MESH_BOUND + 10
"""(b): from the last start to ``vnetd wait --reachable`` exiting 0 in either site, well
below the wait's own ``--timeout`` (``WAIT_TIMEOUT``): a wait that never counts the
other site's ranks fails here, not by its own exit 1."""
WAIT_TIMEOUT = 120
RESUME_BOUND = 5.0
"""(d): from the mapping change to every pair of the moved member answering again.
Without the new registration the pairs never resume; the file is read every
second; measured 0.63-0.87 s here (printed)."""


async def reaches(lab: SitesLab, pod: Pod, address: str) -> bool:
    result = await lab.run(pod, ["ping", "-c", "1", "-W", "0.5", address])
    return result.returncode == 0


def pause_after(mesh: MeshLab, pairs: set[tuple[int, int]], since: float) -> float:
    """How long after ``since`` the last probe request lost between ``pairs`` was sent
    (0: none lost). Read it at least the probe's miss window (1 s) after the pause."""
    sent = [
        float(event["sent"])
        for pair, event in mesh._probe_events("miss", None)
        if pair in pairs and float(event["sent"]) >= since
    ]
    return max(sent, default=since) - since


async def start_in_site(
    mesh: MeshLab, lab: SitesLab, rank: int, public_file: Path | None = None
) -> None:
    pod = mesh.pod(rank)
    flags = ["--site", lab.site(pod).name]
    public = lab.public_endpoint(pod)
    if public_file is not None:
        flags += ["--public-endpoint-file", str(public_file)]
    elif public:
        flags += ["--public-endpoint", public]
    await mesh.start_rank(rank, *flags)


async def test_sites_lab_isolates_the_sites():
    with trio.fail_after(60):
        async with open_sites_lab({"a": 2, "b": 2}, with_etcd=False) as lab:
            a0, a1, b0, b1 = lab.pods
            assert await reaches(lab, a0, a1.underlay_ip)  # within a site: direct
            assert await reaches(lab, b1, b0.underlay_ip)
            assert await reaches(lab, a0, ETCD_IP) and await reaches(lab, b0, ETCD_IP)
            for src, dst in [(a0, b0), (a1, b1), (b0, a0), (b1, a1)]:
                assert not await reaches(lab, src, dst.underlay_ip), (src.name, dst.name)
        # The one-NAT switch: site a's private addresses are reachable, b's are not.
        async with open_sites_lab({"a": 1, "b": 1}, reachable={"a"}, with_etcd=False) as lab:
            a0, b0 = lab.pods
            assert await reaches(lab, b0, a0.underlay_ip)
            assert not await reaches(lab, a0, b0.underlay_ip)
            assert lab.public_endpoint(a0) == f"{a0.underlay_ip}:51820"
            assert lab.public_endpoint(b0) is None


async def test_full_mesh_across_nat_with_a_forwarded_port_each():
    """(a) Ranks 0-2 in site a, 3-5 in b, started in a random order, rank 0 last."""
    seed = random.randrange(1 << 30)
    order = list(range(1, 6))
    random.Random(seed).shuffle(order)
    order.append(0)
    with trio.fail_after(120):
        async with open_sites_lab({"a": 3, "b": 3}) as lab:
            mesh = MeshLab.create(lab)
            for pod in lab.pods:
                await lab.forward(pod)
            await mesh.start_probes()
            for rank in order:
                await start_in_site(mesh, lab, rank)
                await trio.sleep(random.Random(seed + rank).uniform(0, 0.5))
            last_start = time.monotonic()
            full = await mesh.wait_full_mesh(FULL_MESH_BOUND + 15)
            took = full - last_start
            reached = mesh.first_reached()
            slowest = sorted(reached, key=reached.__getitem__)[-3:]
            print(
                "slowest pairs:", {pair: round(reached[pair] - last_start, 2) for pair in slowest}
            )
            print(
                f"seed {seed} order {order}: full mesh across sites {took:.2f} s after the last start"
            )
            assert took < FULL_MESH_BOUND, f"seed {seed}"
            assert not mesh.dead_daemons()
            # Across sites each device holds the public endpoint or where the peer roamed
            # from (its router's address); never a private address of the other site.
            for rank in range(6):
                site = lab.site(mesh.pod(rank))
                for peer, endpoint in (await mesh.device_endpoints(rank)).items():
                    other = lab.site(mesh.pod(peer))
                    if other != site:
                        assert endpoint.startswith(f"{other.public_ip}:"), (rank, peer, endpoint)


async def test_one_nat_case_members_without_a_public_endpoint_are_reached_by_roaming():
    """Site a is reachable (its addresses are public), site b masquerades with no
    forwarded port and no gateway: b's members have no public endpoint, so a's
    daemons add them with none, and WireGuard follows their first packets."""
    with trio.fail_after(120):
        async with open_sites_lab({"a": 2, "b": 2}, reachable={"a"}) as lab:
            mesh = MeshLab.create(lab)
            await mesh.start_probes()
            for rank in (2, 0, 3, 1):
                await start_in_site(mesh, lab, rank)
            last_start = time.monotonic()
            full = await mesh.wait_full_mesh(FULL_MESH_BOUND + 15)
            print(f"one-NAT mesh full {full - last_start:.2f} s after the last start")
            assert full - last_start < FULL_MESH_BOUND
            endpoints = await mesh.device_endpoints(0)
            assert endpoints[1] == f"{mesh.pod(1).underlay_ip}:51820"  # same site
            assert endpoints[2].startswith(f"{lab.site(mesh.pod(2)).public_ip}:")  # roamed


async def test_nat_mapping_change_is_carried_without_a_restart():
    """(d) Rank 1's forwarded port moves and its router forgets its NAT mappings.

    Roaming alone cannot carry this when both sites are behind NAT: each side's
    device holds the other's old mapping, which no longer leads anywhere, so
    neither handshake arrives. Rank 1 re-registers its new public endpoint
    (``--public-endpoint-file``, rewritten by whatever learns the new port); the
    peers write it because the registry's endpoint changed (invariant 4).
    """
    with trio.fail_after(120):
        async with open_sites_lab({"a": 2, "b": 2}) as lab:
            mesh = MeshLab.create(lab)
            for pod in lab.pods:
                await lab.forward(pod)
            await mesh.start_probes(report_every=0.5)
            public_file = mesh.pod(1).dir / "public-endpoint"
            public_file.write_text(f"{lab.public_endpoint(mesh.pod(1))}\n")
            for rank in (1, 2, 3, 0):
                await start_in_site(mesh, lab, rank, public_file if rank == 1 else None)
            await mesh.wait_full_mesh(FULL_MESH_BOUND)
            daemons = {rank: p.pid for rank, p in mesh.daemons.items()}

            moved_at = time.monotonic()
            endpoint = await lab.forward(mesh.pod(1), 41001)
            public_file.write_text(f"{endpoint}\n")
            await trio.sleep(RESUME_BOUND + 3)
            pairs = {(1, r) for r in (0, 2, 3)} | {(r, 1) for r in (0, 2, 3)}
            misses = mesh.probe_misses(moved_at, ranks={0, 1, 2, 3})
            pause = pause_after(mesh, pairs, moved_at)
            print(f"traffic with rank 1 resumed {pause:.2f} s after the mapping changed "
                  f"(lost requests per pair: {misses})")  # fmt: skip
            assert pause < RESUME_BOUND
            now = time.monotonic()
            received = mesh.probe_received(now - 2.5, now, ranks={0, 1, 2, 3})
            assert all(received.get(pair, 0) > 0 for pair in pairs), received
            assert {rank: p.pid for rank, p in mesh.daemons.items()} == daemons
            assert not mesh.dead_daemons()


async def gatewayed_mesh(
    lab: SitesLab, gateways: dict[str, list[int]], pins: dict[str, dict[int, str]] | None = None
) -> MeshLab:
    """The mesh of ``lab`` with these gateways: forwarded, forwarding, and in the spec,
    with each site's ``pins`` (rank: signing key) as its ``gateway_keys``."""
    path = write_spec(lab.workdir / "mesh.toml", len(lab.pods), lab.etcd_urls, ttl=5)
    with path.open("a") as spec:
        for site, ranks in gateways.items():
            spec.write(f"\n[sites.{site}]\ngateways = {ranks}\n")
            keys = ", ".join(
                f'{rank} = "{key}"' for rank, key in (pins or {}).get(site, {}).items()
            )
            if keys:
                spec.write(f"gateway_keys = {{ {keys} }}\n")
    mesh = MeshLab(lab, path, load_spec(path))
    for gateway in (rank for ranks in gateways.values() for rank in ranks):
        pod = mesh.pod(gateway)
        await lab.forward(pod)
        await lab.set_sysctl(pod.netns, "net.ipv4.ip_forward", "1")
        await lab.set_sysctl(pod.netns, "net.ipv4.conf.all.send_redirects", "0")
    return mesh


async def overlay_routed(mesh: MeshLab, rank: int) -> None:
    """Wait until ``rank``'s daemon has routed the overlay (``unreachable``, invariant 9).

    A pod of this lab has a default route (through its NAT router): an
    application that connects before its vnetd has routed the overlay sends
    its SYN there, bound to its underlay address, and that socket never
    reaches the overlay (in Kubernetes the application waits for vnetd's
    readiness or ``vnetd wait``)."""
    network = str(mesh.spec.network)
    with trio.fail_after(20):
        while True:
            shown = await mesh.lab.run(mesh.pod(rank), ["ip", "route", "show", network])
            if shown.stdout.decode().startswith("unreachable"):
                return
            await trio.sleep(0.05)


async def test_sites_behind_nat_reach_each_other_through_their_gateways():
    """(b) Ranks 0-3 in site a, 4-6 in site b: rank 0 in site a and half the workers
    (ranks 1-6) in site b. Only rank 0 (site a) and rank 4 (site b) have a forwarded
    port: they are the gateways; every pair still reaches the other across the
    sites, and the Flux-like broker tree of ``test_flux_overlay.py`` (fan-out 2:
    rank 1 in site a is the parent of ranks 3 in a and 4 in b, rank 2 of ranks 5
    and 6 in b), rendered before any pod exists, forms with rank 0 in site a.
    ``vnetd wait --ranks all --reachable`` beside rank 1 (site a) and rank 5 (site b)
    exits 0 once the mesh forms: the other site's ranks have no peer of their own on
    those devices, and count by their gateway's handshake."""
    with trio.fail_after(150):
        async with open_sites_lab({"a": 4, "b": 3}) as lab:
            mesh = await gatewayed_mesh(lab, {"a": [0], "b": [4]})
            bootstrap = lab.workdir / "flux-bootstrap.toml"
            render_bootstrap(mesh.spec_path, bootstrap, 2)
            await mesh.start_probes()
            brokers = {}
            for rank in [5, 1, 6, 3, 2, 4, 0]:
                await start_in_site(mesh, lab, rank)
                await overlay_routed(mesh, rank)
                brokers[rank] = await start_broker(lab, mesh, rank, bootstrap)
            last_start = time.monotonic()
            async with trio.open_nursery() as nursery:
                gates = {}
                for rank in (1, 5):
                    nursery.start_soon(reachable_wait, mesh, rank, gates)
                full = await mesh.wait_full_mesh(FULL_MESH_BOUND + 15)
            took = full - last_start
            print(f"full mesh through the gateways {took:.2f} s after the last start")
            assert took < FULL_MESH_BOUND
            for rank, (result, done) in gates.items():
                out, err = text(result)
                assert result.returncode == 0, (rank, out, err)
                assert out.startswith("vnetd wait: 7/7 ranks registered; 6/6 peers reachable")
                print(f"vnetd wait --reachable in rank {rank} exited 0 "
                      f"{done - last_start:.2f} s after the last start")  # fmt: skip
            workers = range(1, 7)
            in_b = [r for r in workers if lab.site(mesh.pod(r)).name == "b"]
            assert len(in_b) * 2 == len(workers), in_b  # half the workers burst into b
            await wait_until(
                lambda: set(hellos(brokers[0])) >= set(workers),
                f"hellos at rank 0 (have {sorted(hellos(brokers[0]))})",
                HELLO_WITHIN,
            )
            last_hello = max(e["t"] for got in hellos(brokers[0]).values() for e in got)
            print(f"broker tree: every hello at rank 0 {last_hello - last_start:.2f} s "
                  "after the last start")  # fmt: skip
            # Rank 1 (site a) has its own site's members and gateway 0, holding b's ranks.
            held = {peer: sorted(ips) for peer, ips in (await mesh.device_peers(1)).items()}
            assert sorted(held.values()) == sorted([
                [f"{mesh.address(r)}/32" for r in (0, 4, 5, 6)],
                [f"{mesh.address(2)}/32"], [f"{mesh.address(3)}/32"],
            ])  # fmt: skip


async def reachable_wait(
    mesh: MeshLab, rank: int, gates: dict[int, tuple[subprocess.CompletedProcess[bytes], float]]
) -> None:
    """``vnetd wait --ranks all --reachable`` beside ``rank``'s daemon (its device), bounded
    by ``WAIT_BOUND``; its result and when it ended go to ``gates``."""
    argv = ["--ranks", "all", "--reachable", "--rank", str(rank),
            "--wireguard-dir", "/run/wireguard", "--timeout", str(WAIT_TIMEOUT)]  # fmt: skip
    try:
        result = await vnetd_wait(mesh, rank, *argv, limit=WAIT_BOUND, beside=mesh.daemons[rank])
    except trio.TooSlowError:
        raise AssertionError(f"rank {rank}: vnetd wait --reachable still waits after "
                             f"{WAIT_BOUND:g} s") from None  # fmt: skip
    gates[rank] = (result, time.monotonic())


GATEWAY_FAILOVER_BOUND = 12.0
"""(c): a crashed gateway's entry ends after the lease TTL (5 s in the lab), then
its peers move its routes to the next gateway; bound below two TTLs plus a
5 s handshake retry, above the measured figure: 4.8-5.3 s here (printed)."""


async def test_losing_one_of_two_gateways_keeps_traffic_flowing():
    """(c) Site b has gateways 3 and 4; gateway 3 (the active one) is killed."""
    with trio.fail_after(120):
        async with open_sites_lab({"a": 3, "b": 3}) as lab:
            mesh = await gatewayed_mesh(lab, {"a": [0], "b": [3, 4]})
            await mesh.start_probes(report_every=0.5)
            for rank in (5, 4, 2, 1, 3, 0):
                await start_in_site(mesh, lab, rank)
            await mesh.wait_full_mesh(FULL_MESH_BOUND)
            killed_at = time.monotonic()
            await lab.kill_pod(mesh.pod(3))
            await trio.sleep(GATEWAY_FAILOVER_BOUND + 3)
            live = {0, 1, 2, 4, 5}
            across = {(a, b) for a in live for b in live if (a < 3) != (b < 3)}
            pause = pause_after(mesh, across, killed_at)
            print(f"cross-site traffic paused {pause:.2f} s when gateway 3 died")
            assert pause < GATEWAY_FAILOVER_BOUND
            now = time.monotonic()
            received = mesh.probe_received(now - 2.5, now, ranks=live)
            assert all(received.get(pair, 0) > 0 for pair in across), received
            held = {peer: sorted(ips) for peer, ips in (await mesh.device_peers(5)).items()}
            assert [f"{mesh.address(r)}/32" for r in (0, 1, 2, 4)] in held.values()
