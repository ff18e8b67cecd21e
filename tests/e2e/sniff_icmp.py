"""Count the ICMP echo requests to a network that reach an interface, for a while:
``python sniff_icmp.py IFNAME NETWORK SECONDS``. Prints ``ready`` once listening,
then ``seen N`` at each echo request it counts. Run inside a lab pod (AF_PACKET: root)."""

from __future__ import annotations

import socket
import sys
import time
from ipaddress import ip_address, ip_network

ETH_P_IP = 0x0800
ICMP = 1
ECHO_REQUEST = 8


def main() -> None:
    ifname, network, seconds = sys.argv[1], ip_network(sys.argv[2]), float(sys.argv[3])
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
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
        ip = frame[14:]
        if len(ip) < 28 or ip[9] != ICMP:
            continue
        header = (ip[0] & 0x0F) * 4
        if ip_address(ip[16:20]) in network and ip[header] == ECHO_REQUEST:
            count += 1
            print(f"seen {count}", flush=True)


if __name__ == "__main__":
    main()
