"""The lab's underlay: addresses, fixed MAC addresses, the bridge, and pinned neighbours.

With ``open_lab(..., static_neighbours=True)`` every eth0 gets a fixed MAC
address and every namespace a permanent neighbour entry for every other one,
so nothing is resolved by ARP. The kernel's neighbour table is global: its
``gc_thresh3`` (1024 entries by default, settable only in the root namespace)
counts the entries of every namespace together, and a full mesh of 64 pods
needs about 4,000, so resolution fails with ENOBUFS ("neighbor table
overflow") for every lab on the machine. Permanent entries are exempt from
that limit. The big benchmark labs use it; a real cluster has no such limit
to share.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from vnetd.lab.netns import ip_batch

UNDERLAY_PREFIXLEN = 15
FIRST_POD_IP = ipaddress.IPv4Address("198.18.1.0")
ETCD_IP = "198.18.0.10"
UNDERLAY6_PREFIX = "fd00:198:18::"
"""With ``open_lab(ipv6=True)`` pod i also has ``fd00:198:18::<i+1>/64`` on eth0."""
ETCD_PORT = 2379
ETCD_MAC = "02:76:6c:ff:00:01"
MAX_PODS = 1000
"""A Linux bridge takes at most 1024 ports."""


def pod_mac(index: int) -> str:
    """Pod ``index``'s fixed, locally administered eth0 MAC address."""
    return f"02:76:6c:00:{(index + 1) >> 8:02x}:{(index + 1) & 0xFF:02x}"


def underlay_network() -> ipaddress.IPv4Network:
    """198.18.0.0/15, which every underlay address of the lab is in."""
    return ipaddress.IPv4Network(f"{FIRST_POD_IP}/{UNDERLAY_PREFIXLEN}", strict=False)


def switch_commands(ports: Sequence[tuple[str, str, str]], mtu: int | None) -> list[str]:
    """``ip`` commands for the switch namespace: bridge br0 and, per ``(port, netns, mac)``,
    a veth whose peer is ``eth0`` with that MAC in that namespace."""
    switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
    mtu_arg = f" mtu {mtu}" if mtu else ""
    if mtu_arg:
        switch.append(f"link set br0{mtu_arg}")
    for port, netns, mac in ports:
        switch += [f"link add {port}{mtu_arg} type veth peer name eth0{mtu_arg} address {mac} "
                   f"netns {netns}",
                   f"link set {port} master br0 up"]  # fmt: skip
    return switch


def host_commands(addr: str) -> list[str]:
    """``ip`` commands that bring up lo and eth0 with ``addr`` on the underlay."""
    return ["link set lo up", f"addr add {addr}/{UNDERLAY_PREFIXLEN} dev eth0", "link set eth0 up"]


async def pin_neighbours(
    namespaces: Sequence[str], entries: Sequence[tuple[str, str, str]]
) -> None:
    """In each namespace, a permanent neighbour entry for every ``(owner netns, addr, mac)``
    of the others."""
    for netns in namespaces:
        await ip_batch(
            [f"neigh replace {addr} lladdr {mac} dev eth0 nud permanent"
             for owner, addr, mac in entries if owner != netns]
        , netns=netns)  # fmt: skip


async def repin_neighbour(namespaces: Sequence[str], old_ip: str, new_ip: str, mac: str) -> None:
    """In each namespace, move the permanent entry for ``mac`` from ``old_ip`` to ``new_ip``."""
    for netns in namespaces:
        await ip_batch(
            [f"neigh del {old_ip} dev eth0",
             f"neigh replace {new_ip} lladdr {mac} dev eth0 nud permanent"], netns=netns,
            force=True,
        )  # fmt: skip
