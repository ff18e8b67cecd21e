"""One probe against echo responders that misbehave as a loaded host does, over loopback.

The mechanism behind false failures on a loaded machine, at the smallest scale:
an answer that comes seconds late, and a burst of loss that takes every echo
sent close together. A probe must count the late answer and outlast the burst
(``vnetd.daemon.probe_echo``). Real UDP sockets on 127.0.0.1; real time (seconds).
"""

from __future__ import annotations

import errno
import os
import socket

import pytest
import trio

from vnetd.daemon.probe_echo import _Echoes, probe

MTU = 1420


async def responder(
    sock: trio.socket.SocketType, *, delay: float = 0.0, deaf_for: float = 0.0
) -> None:
    """Echo every datagram ``delay`` s after it came, and none that came within
    ``deaf_for`` s of the first (a burst lost to full buffers)."""
    first: float | None = None
    async with trio.open_nursery() as nursery:
        while True:
            data, source = await sock.recvfrom(65535)
            now = trio.current_time()
            first = now if first is None else first
            if now - first < deaf_for:
                continue

            async def answer(data: bytes = data, source: tuple[str, int] = source) -> None:
                await trio.sleep(delay)
                await sock.sendto(data, source)

            nursery.start_soon(answer)


async def probe_against(**misbehaviour: float) -> tuple[float | None, float | None, int | None]:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        await sock.bind(("127.0.0.1", 0))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: responder(sock, **misbehaviour))
            found = await probe(socket.AF_INET, sock.getsockname(), MTU)
            nursery.cancel_scope.cancel()
    return found.small, found.full, found.largest


async def test_an_answer_that_comes_late_still_proves_the_pair() -> None:
    """Answered 3.5 s late (a starved daemon, or a first handshake on a loaded host):
    the probe listened for 3 s and each size's answer counted only within it."""
    with trio.fail_after(15):
        small, full, largest = await probe_against(delay=3.5)
    assert small is not None and full is not None, (small, full)
    assert small >= 3.0 and largest == MTU


async def test_a_burst_of_loss_does_not_take_every_attempt() -> None:
    """Everything that arrives within 0.5 s of the first echo is lost: three attempts
    sent 50 ms apart were lost together."""
    with trio.fail_after(15):
        small, full, largest = await probe_against(deaf_for=0.5)
    assert small is not None and full is not None and largest == MTU


async def test_nothing_answered_is_a_loss_within_the_bound() -> None:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock, trio.fail_after(15):
        await sock.bind(("127.0.0.1", 0))  # bound, never read: every echo is lost
        found = await probe(socket.AF_INET, sock.getsockname(), MTU)
    assert (found.small, found.full, found.largest) == (None, None, None)
    # Every attempt of both sizes was written (inner IP packets): what the sender's device
    # must have sent, had the echoes reached it (the outbound-drop evidence).
    assert found.written == 6 * (64 + MTU)


class RefusingSocket:
    """A socket whose every send fails with one errno."""

    def __init__(self, code: int) -> None:
        self.code = code

    async def send(self, data: bytes) -> int:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize(
    ("code", "written"),
    [
        pytest.param(errno.EPERM, 64, id="a-firewall-rule-in-the-pod-dropped-it-written"),
        pytest.param(errno.EMSGSIZE, 0, id="too-big-for-the-route-never-written"),
        pytest.param(errno.EHOSTUNREACH, 0, id="no-route-never-written"),
    ],
)
async def test_a_send_a_rule_refused_counts_as_written_and_no_other(
    code: int, written: int
) -> None:
    echoes = _Echoes(RefusingSocket(code), socket.AF_INET)  # type: ignore[arg-type]
    await echoes._send(64)
    assert echoes.written == written
