"""Count the ICMP echo requests to some networks that reach an interface, for a while:
``python sniff_icmp.py IFNAME NETWORK[,NETWORK...] SECONDS`` (IPv4 or IPv6 networks).
Prints ``ready`` once listening, then ``seen N DESTINATION`` at each echo request it
counts. Run inside a lab pod (AF_PACKET: root)."""

from __future__ import annotations

import socket
import sys
import time
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network

ETH_P_ALL = 0x0003
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
ICMP, ICMPV6 = 1, 58
ECHO_REQUEST, ECHO_REQUEST6 = 8, 128


def echo_to(frame: bytes) -> IPv4Address | IPv6Address | None:
    """The destination of an ICMP or ICMPv6 echo request in an Ethernet frame, else None
    (an IPv6 packet with extension headers before ICMPv6 is not looked into)."""
    kind, ip = int.from_bytes(frame[12:14], "big"), frame[14:]
    if kind == ETH_P_IP and len(ip) >= 28 and ip[9] == ICMP:
        if ip[(ip[0] & 0x0F) * 4] == ECHO_REQUEST:
            return ip_address(ip[16:20])
    if kind == ETH_P_IPV6 and len(ip) >= 48 and ip[6] == ICMPV6 and ip[40] == ECHO_REQUEST6:
        return ip_address(ip[24:40])
    return None


def main() -> None:
    ifname, seconds = sys.argv[1], float(sys.argv[3])
    networks = [ip_network(text) for text in sys.argv[2].split(",")]
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, 0))
    sock.settimeout(0.2)
    print("ready", flush=True)
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            frame = sock.recv(2048)
        except TimeoutError:
            continue
        destination = echo_to(frame)
        if destination is not None and any(destination in net for net in networks):
            count += 1
            print(f"seen {count} {destination}", flush=True)


if __name__ == "__main__":
    main()
