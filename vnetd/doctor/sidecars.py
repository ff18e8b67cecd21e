"""Foreign service-mesh sidecars in this pod, told from the ports its network namespace
listens on.

Every container of a pod shares its network namespace, so a proxy injected beside
Flux and vnetd listens in the namespace vnetd reads: ``/proc/net/tcp`` and
``/proc/net/tcp6`` of any process in it list the sockets of all of them, with no
privilege. A proxy is named when both of its capture ports listen (one alone is
too common a port to be a proxy's mark). The facts relied on:

* Istio's sidecar (envoy): TCP 15001 is its outbound capture and 15006 its inbound
  capture, where its iptables rules (``ISTIO_REDIRECT``, ``ISTIO_IN_REDIRECT``)
  redirect the pod's TCP ("Ports used by Istio",
  istio.io/latest/docs/ops/deployment/requirements).
* Linkerd's proxy (linkerd2-proxy): inbound on 4143, outbound on 127.0.0.1:4140,
  where linkerd-init's rules redirect the pod's TCP (its start-up log's "Inbound
  interface on 0.0.0.0:4143", "Outbound interface on 127.0.0.1:4140";
  linkerd.io/2/common-errors/network-policy).

Both capture TCP only, so WireGuard's UDP passes and the overlay looks healthy;
what they break is Flux's TCP on the overlay interface (STRICT mTLS refuses the
brokers' ZeroMQ), and a sidecar that never exits keeps the Job from completing.
Pure: the caller reads the tables (``vnetd.observe.gate``, ``vnetd doctor``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"
"""The kernel's TCP_LISTEN, as ``/proc/net/tcp`` writes a socket's state."""


@dataclass(frozen=True)
class Proxy:
    """A service mesh's sidecar proxy: what it is, its capture ports, how to keep it out."""

    name: str
    ports: tuple[int, ...]
    opt_out: str


PROXIES = (
    Proxy(
        "Istio's sidecar proxy (envoy)",
        (15001, 15006),
        'the rendered pod carries sidecar.istio.io/inject: "false" (label and annotation); '
        "something injected it anyway: the namespace's or the mesh's injection policy "
        "(alwaysInjectSelector, a webhook of its own)",
    ),
    Proxy(
        "Linkerd's proxy (linkerd2-proxy)",
        (4140, 4143),
        "the rendered pod carries linkerd.io/inject: disabled; something injected it "
        "anyway: the namespace's or the workload's linkerd.io/inject annotation, or a "
        "webhook of its own",
    ),
)


def listening_ports(tables: Iterable[str]) -> set[int]:
    """The TCP ports listened on, from the text of ``/proc/net/tcp`` and ``tcp6``; lines
    that do not parse (the header) are skipped."""
    ports: set[int] = set()
    for table in tables:
        for line in table.splitlines():
            fields = line.split()
            if len(fields) < 4 or fields[3] != LISTEN:
                continue
            _address, _, port = fields[1].rpartition(":")
            try:
                ports.add(int(port, 16))
            except ValueError:
                continue
    return ports


def foreign_proxies(ports: Collection[int]) -> list[Proxy]:
    """The proxies all of whose capture ports are in ``ports``."""
    return [proxy for proxy in PROXIES if all(port in ports for port in proxy.ports)]


def proxy_line(proxy: Proxy, interface: str) -> str:
    """One line naming ``proxy`` as the reason, what it breaks and where to look."""
    ports = " and ".join(str(port) for port in proxy.ports)
    return (
        f"foreign sidecar in this pod: {proxy.name} listens on its capture ports "
        f"(TCP {ports}): its capture takes Flux's TCP on {interface}, and a sidecar that "
        f"never exits keeps the Job from completing; {proxy.opt_out}"
    )


def proxy_lines(tables: Iterable[str], interface: str) -> list[str]:
    """A ``proxy_line`` for each foreign proxy listening in the pod whose TCP tables
    (``/proc/net/tcp``, ``tcp6``) are ``tables``."""
    ports = listening_ports(tables)
    return [proxy_line(proxy, interface) for proxy in foreign_proxies(ports)]
