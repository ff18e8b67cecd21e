"""A dual-stack overlay (``network`` + ``network6``) with real etcd and wireguard-go.

Each rank holds an IPv4 and an IPv6 overlay address on one device; each peer
carries both host routes (/32 and /128) as allowed IPs, and both overlay
networks are routed ``unreachable``, so a rank that has not joined fails at
once in either family. Over an IPv4 underlay (three pods) and an IPv6 one
(two pods), every pod's probe reaches every other pod's address in both
families, within the formation bounds of ``bounds.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio
from bounds import AFTER_CLAIM, FORMATION

from vnetd.lab.cluster import MeshLab
from vnetd.lab.open_lab import Lab, LabProcess, Pod, open_lab
from vnetd.lab.probe import parse_events, probe_command

NETWORK, NETWORK6 = "10.250.0.0/24", "fd00:250::/64"
PING = ["ping", "-c", "1", "-W", "2"]


def write_spec(path: Path, etcd_url: str, size: int) -> Path:
    path.write_text(
        f"""[mesh]
name = "ds"
size = {size}
network = "{NETWORK}"
network6 = "{NETWORK6}"
hostname = "ds-{{rank}}"
interface = "vnet0"

[registry]
endpoints = ["{etcd_url}"]
lease_ttl = 5
"""
    )
    return path


def addresses(rank: int) -> tuple[str, str]:
    return f"10.250.0.{rank + 1}", f"fd00:250::{rank + 1:x}"


async def probe_full_mesh(mesh: MeshLab, ranks: int, what: str) -> None:
    """Until every pod's probe has an answer from every other pod's IPv4 and IPv6 overlay
    address; bounded as ``bounds.form`` bounds a formation (probes started first)."""
    wanted = {(rank, a) for rank in range(ranks) for o in range(ranks) if o != rank
              for a in addresses(o)}  # fmt: skip
    begun = min(mesh.started_at.values())
    reached: dict[tuple[int, str], float] = {}
    while missing := wanted - set(reached):
        assert time.monotonic() < begun + FORMATION, (
            f"{what}: not reached within {FORMATION} s: {sorted(missing)}; "
            f"exited daemons: {mesh.dead_daemons()}"
        )
        await trio.sleep(0.1)
        for rank, probe in mesh.probes.items():
            for event in parse_events(probe.log_text()):
                if event.get("event") == "reached":
                    reached.setdefault((rank, event["target"]), float(event["t"]))
    claims = [mesh.claimed_at(rank) for rank in range(ranks)]
    assert None not in claims, claims
    full = max(reached.values())
    start = max([t for t in claims if t is not None] + [mesh.probes_started(set(range(ranks)))])
    after_claim = full - start
    print(
        f"{what}: {ranks} pods reach each other in both families {full - begun:.2f} s after "
        f"the first start, {after_claim:.2f} s after the last claim"
    )
    assert after_claim <= AFTER_CLAIM, (
        f"the last pair answered {after_claim:.2f} s after the last claim (bound {AFTER_CLAIM} s)"
    )


async def start_probes(mesh: MeshLab, ranks: int) -> None:
    """A probe per pod answering on its IPv4 and IPv6 overlay addresses and probing
    every other pod's, both families, every 100 ms."""
    for rank in range(ranks):
        targets = [a for other in range(ranks) if other != rank for a in addresses(other)]
        argv = probe_command(addresses(rank)[0], targets, duration=120)
        mesh.probes[rank] = await mesh.lab.start(mesh.pod(rank), argv, private_mount=False)


async def allowed_ips(lab: Lab, rank: int, daemon: LabProcess) -> set[tuple[str, ...]]:
    """Each peer's allowed IPs from ``wg show vnet0 allowed-ips`` in the daemon's namespaces."""
    shown = await lab.run(lab.pods[rank], ["wg", "show", "vnet0", "allowed-ips"], beside=daemon)
    assert shown.returncode == 0, shown.stderr.decode()
    return {tuple(sorted(line.split()[1:])) for line in shown.stdout.decode().splitlines()}


def expected_allowed(rank: int, ranks: int) -> set[tuple[str, ...]]:
    return {
        (f"{addresses(other)[0]}/32", f"{addresses(other)[1]}/128")
        for other in range(ranks)
        if other != rank
    }


async def routes(lab: Lab, pod: Pod, family: str) -> list[dict[str, object]]:
    result = await lab.run(pod, ["ip", "-j", family, "route", "show", "table", "main"])
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def check_routes(lab: Lab, rank: int, ranks: int) -> None:
    """Both networks routed unreachable; a host route to vnet0 for each peer address."""
    pod = lab.pods[rank]
    for family, network, index in (("-4", NETWORK, 0), ("-6", NETWORK6, 1)):
        found = await routes(lab, pod, family)
        assert {"type": "unreachable", "dst": network} in [
            {"type": r.get("type"), "dst": r["dst"]} for r in found
        ], found
        via_device = {r["dst"] for r in found if r.get("dev") == "vnet0" and "type" not in r}
        peers = {addresses(other)[index] for other in range(ranks) if other != rank}
        assert peers <= via_device, (family, via_device)
        assert addresses(rank)[index] not in via_device


async def check_device_addresses(lab: Lab, rank: int) -> None:
    result = await lab.run(lab.pods[rank], ["ip", "-j", "addr", "show", "dev", "vnet0"])
    info = json.loads(result.stdout)[0]["addr_info"]
    held = {(a["local"], a["prefixlen"]) for a in info if a["scope"] == "global"}
    v4, v6 = addresses(rank)
    assert held == {(v4, 24), (v6, 64)}


async def test_dual_stack_overlay_over_an_ipv4_underlay() -> None:
    ranks = 3
    with trio.fail_after(FORMATION + 60):
        async with open_lab(ranks + 1) as lab:
            # A spec of 4 ranks, 3 started: rank 3's addresses must fail at once.
            spec = write_spec(lab.workdir / "ds.toml", lab.etcd_url, ranks + 1)
            mesh = MeshLab.create(lab)
            await start_probes(mesh, ranks)
            daemons = [await mesh.start_rank(rank, config=spec) for rank in range(ranks)]
            await probe_full_mesh(mesh, ranks, "dual stack over IPv4")
            for rank, daemon in enumerate(daemons):
                assert await allowed_ips(lab, rank, daemon) == expected_allowed(rank, ranks)
                await check_routes(lab, rank, ranks)
                await check_device_addresses(lab, rank)
                v4, v6 = addresses(rank)
                assert f"starting: rank {rank} address {v4}/24, {v6}/64 on vnet0" in (
                    daemon.log_text()
                )
            for absent in addresses(ranks):
                t0 = trio.current_time()
                result = await lab.run(lab.pods[0], [*PING, absent], timeout=10)
                elapsed = trio.current_time() - t0
                print(f"ping {absent} (rank {ranks}, not started): failed in {elapsed:.2f} s")
                assert result.returncode != 0
                # ping: connect: No route to host (an unreachable route), not a 2 s timeout.
                assert b"No route to host" in result.stderr + result.stdout, result


async def test_dual_stack_overlay_over_an_ipv6_underlay() -> None:
    ranks = 2
    with trio.fail_after(FORMATION + 60):
        async with open_lab(ranks, ipv6=True) as lab:
            spec = write_spec(lab.workdir / "ds6.toml", lab.etcd_url, ranks)
            mesh = MeshLab.create(lab)
            endpoints = [f"[{pod.underlay_ip6}]:51820" for pod in lab.pods]
            await start_probes(mesh, ranks)
            daemons = [
                await mesh.start_rank(rank, "--endpoint", endpoints[rank], config=spec)
                for rank in range(ranks)
            ]
            await probe_full_mesh(mesh, ranks, "dual stack over IPv6")
            for rank, daemon in enumerate(daemons):
                dump = await lab.run(lab.pods[rank], ["wg", "show", "vnet0", "dump"], beside=daemon)
                (peer,) = [line.split("\t") for line in dump.stdout.decode().splitlines()[1:]]
                other = 1 - rank
                v4, v6 = addresses(other)
                # The IPv6 underlay endpoint, and both of the peer's host routes.
                assert (peer[2], peer[3]) == (endpoints[other], f"{v4}/32,{v6}/128")
                await check_routes(lab, rank, ranks)
                await check_device_addresses(lab, rank)
