"""The daemon's route socket against a real kernel, in a network namespace of its own.

``RouteSocket`` (vnetd/dataplane/rtnetlink/route_socket.py) changes the peers' host routes
over one netlink socket. Here it runs in a child process started with ``unshare
--net`` (a fresh namespace, gone with the process), on its loopback link: a
batch far larger than the socket's receive buffer holds acknowledgements for
(about 270 at the default size) must be applied, and reported, whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CHILD = """
import json, socket, subprocess, sys, trio
from vnetd.dataplane.rtnetlink.route_socket import RouteSocket

count = int(sys.argv[1])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
index = socket.if_nametoindex("lo")
routes = {f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}/32" for i in range(1, count + 1)}

def shown():
    out = subprocess.run(["ip", "-4", "route", "show", "dev", "lo"], capture_output=True,
                         text=True, check=True).stdout
    return len([line for line in out.splitlines() if line.startswith("10.")])

async def main():
    sock = RouteSocket()
    await sock.change(index, set(), routes)
    added = shown()
    await sock.change(index, set(), routes)  # again: already there is no error
    again = shown()
    await sock.change(index, routes, set())
    print(json.dumps({"added": added, "again": again, "left": shown()}))

trio.run(main)
"""


@pytest.mark.parametrize("count", [1, 1000])
def test_a_batch_of_routes_larger_than_the_receive_buffer_is_applied_whole(count: int):
    result = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD, str(count)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"added": count, "again": count, "left": 0}
