"""A lab of two sites behind NAT routers, for multi-site meshes (docs/architecture.md, "Sites").

Layout of a sites lab with id ``ab12`` (nothing lives in the root namespace)::

    vlab-ab12-sw      bridges: pub (public), site0 and site1 (one per site)
    vlab-ab12-rta     router of site a: eth0 10.1.0.1/24 on site0, eth1 198.18.0.1/15 on pub
    vlab-ab12-rtb     router of site b: eth0 10.2.0.1/24 on site1, eth1 198.18.0.2/15 on pub
    vlab-ab12-etcd    eth0 198.18.0.10/15 on pub, etcd on :2379
    vlab-ab12-pod0    eth0 10.1.0.10/24 on site0, default route via 10.1.0.1 ...

Each router masquerades what leaves by its public side and lets nothing in
but the UDP ports it forwards (``forward``), with nftables; the public side
has no route to any private address, so no pod of one site reaches a private
address of the other. With ``reachable={"a"}`` site a's router routes
instead of NATing and the public side routes to site a's network: the
one-NAT case, where site a's private addresses are reachable from site b.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import AsyncIterator, Mapping, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from vnetd.lab.netns import ip_batch
from vnetd.lab.open_lab import ETCD_IP, ETCD_MAC, UNDERLAY_PREFIXLEN, Lab, LabError, Pod, open_lab

WG_PORT = 51820
FIRST_FORWARDED_PORT = 40000
"""``forward`` defaults pod i to public port 40000 + i."""


@dataclass(frozen=True)
class Site:
    """One site: its bridge, its router namespace and its addresses."""

    name: str
    index: int
    router_netns: str
    reachable: bool

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{self.index + 1}.0.0/24")

    @property
    def gateway(self) -> str:
        """The router's private address, every pod's default route."""
        return str(self.network.network_address + 1)

    @property
    def public_ip(self) -> str:
        """The router's address on the public bridge: what other sites reach."""
        return f"198.18.0.{self.index + 1}"


class SitesLab(Lab):
    """A ``Lab`` whose pods sit in sites behind NAT routers; get one from ``open_sites_lab``."""

    def __init__(
        self,
        lab_id: str,
        workdir: Path,
        *,
        sites: Mapping[str, int],
        reachable: Set[str] = frozenset(),
    ) -> None:
        self.sites = {
            name: Site(name, i, f"vlab-{lab_id}-rt{name}", name in reachable)
            for i, name in enumerate(sites)
        }
        self.site_of = [name for name, count in sites.items() for _ in range(count)]
        self.forwards: dict[int, int] = {}
        """Pod index -> the public UDP port its router forwards to its WireGuard port."""
        super().__init__(lab_id, workdir, len(self.site_of))

    def _pod(self, index: int) -> Pod:
        pod = super()._pod(index)
        site = self.sites[self.site_of[index]]
        first_host = sum(1 for i in range(index) if self.site_of[i] == site.name)
        address = str(site.network.network_address + 10 + first_host)
        return Pod(pod.index, pod.name, pod.netns, address, pod.dir)

    @property
    def netns_names(self) -> list[str]:
        return [*super().netns_names, *(site.router_netns for site in self.sites.values())]

    def site(self, pod: Pod) -> Site:
        return self.sites[self.site_of[pod.index]]

    def public_endpoint(self, pod: Pod) -> str | None:
        """Where other sites reach ``pod``'s WireGuard port, or None (not forwarded)."""
        site = self.site(pod)
        if site.reachable:
            return f"{pod.underlay_ip}:{WG_PORT}"
        port = self.forwards.get(pod.index)
        return f"{site.public_ip}:{port}" if port else None

    async def forward(self, pod: Pod, port: int | None = None) -> str:
        """Have ``pod``'s router forward public UDP ``port`` (default 40000 + index) to
        the pod's WireGuard port, in place of any port forwarded to it before; returns
        the public endpoint. A moved port also forgets the router's NAT mappings
        (conntrack), as a replaced NAT gateway would."""
        moved = pod.index in self.forwards
        self.forwards[pod.index] = port or FIRST_FORWARDED_PORT + pod.index
        site = self.site(pod)
        rules = [
            f'add rule ip vlab inbound iifname "eth1" udp dport {public} '
            f"dnat to {self.pods[index].underlay_ip}:{WG_PORT}"
            for index, public in sorted(self.forwards.items())
            if self.site_of[index] == site.name
        ]
        await self._nft(site, ["flush chain ip vlab inbound", *rules])
        if moved:
            await self._flush_conntrack(site)
        endpoint = self.public_endpoint(pod)
        assert endpoint is not None
        return endpoint

    async def _nft(self, site: Site, commands: list[str]) -> None:
        script = "".join(f"{line}\n" for line in commands)
        argv = ["ip", "netns", "exec", site.router_netns, "nft", "-f", "-"]
        with trio.fail_after(10):
            result = await trio.run_process(argv, stdin=script.encode(), capture_stdout=True,
                                            capture_stderr=True, check=False)  # fmt: skip
        if result.returncode != 0:
            raise LabError(f"nft in {site.router_netns}: {result.stderr.decode(errors='replace')}")

    async def _flush_conntrack(self, site: Site) -> None:
        code = "from pyroute2 import Conntrack; Conntrack().flush()"
        argv = ["ip", "netns", "exec", site.router_netns, sys.executable, "-c", code]
        with trio.fail_after(10):
            result = await trio.run_process(argv, capture_stderr=True, check=False)
        if result.returncode != 0:
            raise LabError(f"conntrack flush: {result.stderr.decode(errors='replace')}")

    async def _build(self) -> None:
        await self._make_dirs_and_netns()
        switch = ["link set lo up", "link add pub type bridge", "link set pub up",
                  f"link add etcd type veth peer name eth0 address {ETCD_MAC} "
                  f"netns {self.etcd_netns}", "link set etcd master pub up"]  # fmt: skip
        for site in self.sites.values():
            bridge, port = f"site{site.index}", f"rt{site.index}"
            switch += [f"link add {bridge} type bridge", f"link set {bridge} up",
                       f"link add {port}p type veth peer name eth0 netns {site.router_netns}",
                       f"link add {port}u type veth peer name eth1 netns {site.router_netns}",
                       f"link set {port}p master {bridge} up",
                       f"link set {port}u master pub up"]  # fmt: skip
        for pod in self.pods:
            switch += [f"link add p{pod.index} type veth peer name eth0 netns {pod.netns}",
                       f"link set p{pod.index} master site{self.site(pod).index} up"]  # fmt: skip
        await ip_batch(switch, netns=self.switch_netns)
        reachable = [site for site in self.sites.values() if site.reachable]
        public = ["link set lo up", f"addr add {ETCD_IP}/{UNDERLAY_PREFIXLEN} dev eth0",
                  "link set eth0 up"]  # fmt: skip
        await ip_batch(public + _routes_to(reachable), netns=self.etcd_netns)
        for site in self.sites.values():
            await self._build_router(site, _routes_to([r for r in reachable if r != site]))
        for pod in self.pods:
            site = self.site(pod)
            await ip_batch(["link set lo up", f"addr add {pod.underlay_ip}/24 dev eth0",
                            "link set eth0 up", f"route add default via {site.gateway}"],
                           netns=pod.netns)  # fmt: skip

    async def _build_router(self, site: Site, routes: list[str]) -> None:
        await ip_batch(["link set lo up", f"addr add {site.gateway}/24 dev eth0",
                        f"addr add {site.public_ip}/{UNDERLAY_PREFIXLEN} dev eth1",
                        "link set eth0 up", "link set eth1 up", *routes],
                       netns=site.router_netns)  # fmt: skip
        await self.set_sysctl(site.router_netns, "net.ipv4.ip_forward", "1")
        if site.reachable:  # routes, no NAT, no filter: its pods are public
            return
        await self._nft(site, [
            "table ip vlab {",
            "  chain inbound { type nat hook prerouting priority dstnat; }",
            "  chain outbound { type nat hook postrouting priority srcnat;",
            '    oifname "eth1" masquerade; }',
            "  chain forwarding { type filter hook forward priority filter; policy drop;",
            "    ct state established,related accept",
            '    iifname "eth0" oifname "eth1" accept',
            "    ct status dnat accept",
            "  }",
            "}",
        ])  # fmt: skip


def _routes_to(sites: list[Site]) -> list[str]:
    return [f"route add {site.network} via {site.public_ip}" for site in sites]


@asynccontextmanager
async def open_sites_lab(
    sites: Mapping[str, int],
    *,
    reachable: Set[str] = frozenset(),
    workdir: Path | None = None,
    with_etcd: bool = True,
) -> AsyncIterator[SitesLab]:
    """Build a sites lab (``{"a": 4, "b": 4}``: pods 0-3 in site a, 4-7 in b) with etcd
    on the public side, yield it, and tear it all down (``open_lab``'s guarantees).

    Args:
        reachable: sites whose private addresses the public side reaches (no NAT).
        workdir, with_etcd: as ``open_lab`` takes them.
    """
    unknown = set(reachable) - set(sites)
    if unknown:
        raise ValueError(f"reachable names no site of {sorted(sites)}: {sorted(unknown)}")
    make = partial(SitesLab, sites=sites, reachable=reachable)
    pods = sum(sites.values())
    async with open_lab(pods, workdir=workdir, with_etcd=with_etcd, make=make) as lab:
        assert isinstance(lab, SitesLab)
        yield lab
