"""The probe service over loopback: real sockets, real echoes, a fake device.

A mesh on 127.0.0.0/24 puts every rank's overlay address on the loopback
interface, so three services (ranks 0-2) run in this process and the doctor's
own client (``gather.ask``) asks them for rows; rank 3 has no service. Traffic
stays on 127.0.0.0/8.
"""

from __future__ import annotations

import random
import time
from ipaddress import ip_interface, ip_network

import trio
from shared import wide_key as key

from vnetd.commands.doctor.gather import ask
from vnetd.commands.doctor.plan import DoctorPlan
from vnetd.daemon.probe_service import ProbeService
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.doctor.evidence import LAG_LIMIT
from vnetd.model import DevicePeer, Member
from vnetd.spec import parse_spec

PORT = random.randrange(40000, 50000)
SPEC = parse_spec({"mesh": {"name": "loop", "size": 4, "network": "127.0.0.0/24",
                            "doctor_port": PORT}})  # fmt: skip
MTU = 1420


def service(rank: int) -> ProbeService:
    config = DeviceConfig("lo", "x", 51820, ip_interface(f"127.0.0.{rank + 1}/24"),
                          ip_network("127.0.0.0/24"), MTU)  # fmt: skip
    device = FakeDataplane(config)
    device.device = {
        key(r): DevicePeer(key(r), SPEC.allowed_ips(r), f"198.18.0.{r}:51820", 0.0, 10, 20)
        for r in range(4) if r != rank
    }  # fmt: skip
    me = Member(rank, key(rank), f"198.18.0.{rank}:51820", f"pod{rank}")
    return ProbeService(SPEC, me, MTU, device)


async def test_a_row_over_loopback_names_who_answers_and_who_does_not() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for rank in range(3):
                await nursery.start(service(rank).serve)
            plan = DoctorPlan(SPEC)
            row = await ask(plan, 0, (0, 1, 2, 3), 6.0)
            assert row is not None
            assert (row.rank, row.instance, row.public_key, row.mtu) == (0, "pod0", key(0), MTU)
            assert sorted(row.peers) == [1, 2, 3]
            for rank in (1, 2):
                seen = row.peers[rank]
                assert seen.small_rtt is not None and seen.full_rtt is not None, seen
                assert (seen.key, seen.largest, seen.rx_bytes) == (key(rank), MTU, 10)
            assert row.peers[3].small_rtt is None and row.peers[3].largest is None
            assert await ask(plan, 3, (0, 1, 2, 3), 2.0) is None  # no service there
            nursery.cancel_scope.cancel()


async def test_a_garbage_request_is_dropped_and_the_service_keeps_serving() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service(0).serve)
            await nursery.start(service(1).serve)
            stream = await trio.open_tcp_stream("127.0.0.1", PORT)
            await stream.send_all(b"GET / HTTP/1.1\r\n\r\n\n")
            assert await stream.receive_some(100) == b""
            await stream.aclose()
            row = await ask(DoctorPlan(SPEC), 0, (0, 1), 6.0)
            assert row is not None and row.peers[1].small_rtt is not None
            nursery.cancel_scope.cancel()


async def test_a_row_probed_on_a_starved_event_loop_says_how_late_it_ran() -> None:
    """The daemon's loop is blocked for 1.5 s while it probes (a loaded host): every
    peer of its row carries that lag, so its losses are not taken as a network fault,
    and a peer that answered still passes."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            prober = service(0)
            await nursery.start(prober.serve)
            await nursery.start(service(1).serve)

            async def starve() -> None:
                await trio.sleep(0.3)
                time.sleep(1.5)  # noqa: ASYNC251 (the point: the loop does not run)

            nursery.start_soon(starve)
            row = await prober.row([1, 3], 6.0)  # rank 3 has no service: the row waits
            assert all(seen.lag > LAG_LIMIT for seen in row.peers.values()), row.peers
            assert row.peers[1].small_rtt is not None and row.peers[3].small_rtt is None
            nursery.cancel_scope.cancel()
