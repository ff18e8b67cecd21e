"""The HTTP endpoint's bounds: ``/status`` only to the loopback, and one build of
``/status`` or ``/metrics`` per ``SHARED_FOR`` seconds however many ask."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from vnetd.asgi import Message
from vnetd.observe.http import SHARED_FOR, App, Check


class CountingEndpoints:
    def __init__(self) -> None:
        self.builds = 0

    async def health(self) -> Check:
        return Check(True, "ok")

    async def ready(self) -> Check:
        return Check(True, "ok")

    async def metrics(self) -> bytes:
        self.builds += 1
        await trio.sleep(0.3)  # a device read under the data-plane lock
        return b"vnetd_up 1\n"

    async def status(self) -> dict[str, Any]:
        self.builds += 1
        await trio.sleep(0.3)
        return {"builds": self.builds}


async def get(app: App, path: str, client: tuple[str, int] | None) -> tuple[int, bytes]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "client": client}
    await app(scope, receive, send)
    return int(sent[0]["status"]), bytes(sent[1]["body"])


@pytest.mark.parametrize(
    ("client", "status"),
    [
        pytest.param(("127.0.0.1", 40000), 200, id="ipv4-loopback"),
        pytest.param(("::1", 40000), 200, id="ipv6-loopback"),
        pytest.param(("10.1.2.3", 40000), 403, id="pod-network"),
        pytest.param(("::ffff:10.1.2.3", 40000), 403, id="mapped-remote"),
        pytest.param(None, 403, id="unknown-client"),
    ],
)
async def test_status_answers_only_the_loopback(
    client: tuple[str, int] | None, status: int
) -> None:
    answer = await get(App(CountingEndpoints()), "/status", client)
    assert answer[0] == status
    if status == 403:
        assert answer[1] == b"/status answers only from inside the pod (loopback)\n"


async def test_metrics_answer_anyone() -> None:
    assert (await get(App(CountingEndpoints()), "/metrics", ("10.1.2.3", 1)))[0] == 200


@pytest.mark.parametrize("path", ["/status", "/metrics"])
async def test_concurrent_requests_share_one_build_per_interval(
    path: str, autojump_clock: trio.testing.MockClock
) -> None:
    endpoints = CountingEndpoints()
    app = App(endpoints)
    answers: list[tuple[int, bytes]] = []

    async def ask() -> None:
        answers.append(await get(app, path, ("127.0.0.1", 1)))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(ask)
    assert endpoints.builds == 1
    assert len(answers) == 50 and len({body for _, body in answers}) == 1
    await trio.sleep(SHARED_FOR)
    await ask()
    assert endpoints.builds == 2
    if path == "/status":
        assert json.loads(answers[-1][1]) == {"builds": 2}
