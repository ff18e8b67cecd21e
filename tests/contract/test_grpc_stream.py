"""What only the gRPC watch (``vnetd.registry.etcd.grpc_watch``) has, on a real etcd on
loopback: its worker thread never outlives the watch, it moves past a dead watch
endpoint and off a frozen grpc-proxy (etcd's, on loopback), and it refuses to wait
on a store that was reset. (The registry contract
suite runs against it too: the ``etcd-grpc`` backend.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from vnetd.errors import RegistryUnavailable
from vnetd.lab.etcd import ETCD_BIN, free_port, run_etcd
from vnetd.registry.base import WatchEvent
from vnetd.registry.etcd.grpc_watch import PING_EVERY, PING_TIMEOUT, GrpcWatchRegistry

BOUND = 10.0
CLOSED = 1.0
"""A watch's close returns within this long: below the lab etcd's 2 s progress
notifications, the only other thing that would wake a thread the close did not."""


@asynccontextmanager
async def grpc_registry(
    tmp_path: Path, watch_endpoints: tuple[str, ...] = ()
) -> AsyncIterator[tuple[GrpcWatchRegistry, str]]:
    async with run_etcd(tmp_path / "etcd") as server:
        registry = GrpcWatchRegistry(
            [server.url], watch_endpoints=watch_endpoints or (server.url,), timeout=2.0
        )
        try:
            yield registry, server.url
        finally:
            await registry.aclose()


def stream_threads() -> int:
    """Threads running a watch's worker (``_drain`` on their stack)."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_drain" and "grpc_stream" in frame.f_code.co_filename:
                count += 1
                break
            frame = frame.f_back  # type: ignore[assignment]
    return count


async def first_batch(batches: AsyncIterator[list[WatchEvent]]) -> list[WatchEvent]:
    async for batch in batches:
        return batch
    raise AssertionError("the watch ended")


async def test_the_worker_thread_ends_with_the_watch(tmp_path: Path) -> None:
    async with grpc_registry(tmp_path) as (registry, _url):
        with trio.fail_after(BOUND):
            await registry.create("m/a", b"1")
            async with registry.watch("m/", 1) as batches:
                assert stream_threads() == 1
                [event] = await first_batch(batches)
                assert event.key == "m/a"
                closing = trio.current_time()
            assert trio.current_time() - closing < CLOSED
            assert stream_threads() == 0


async def test_a_cancelled_consumer_leaves_no_worker_thread(tmp_path: Path) -> None:
    """The daemon's exit: its nursery cancelled while the watch waits for an event."""
    async with grpc_registry(tmp_path) as (registry, _url):
        with trio.fail_after(BOUND):
            _, revision = await registry.list_prefix("m/")
            with trio.move_on_after(0.5) as waited:
                async with registry.watch("m/", revision + 1) as batches:
                    await first_batch(batches)
            assert waited.cancelled_caught
            assert trio.current_time() - waited.deadline < CLOSED
            assert stream_threads() == 0


async def test_the_watch_moves_past_a_dead_watch_endpoint(tmp_path: Path) -> None:
    async with run_etcd(tmp_path / "etcd") as server:
        registry = GrpcWatchRegistry(
            [server.url], watch_endpoints=("http://127.0.0.1:1", server.url), timeout=2.0
        )
        try:
            with trio.fail_after(BOUND):
                await registry.create("m/k", b"v")
                async with registry.watch("m/", 1) as batches:
                    [event] = await first_batch(batches)
                assert event.key == "m/k"
        finally:
            await registry.aclose()


async def test_a_watch_past_the_stores_revision_is_refused(tmp_path: Path) -> None:
    """A start after the store's revision: the store was reset, and etcd would wait
    silently for revisions that will carry other writes."""
    async with grpc_registry(tmp_path) as (registry, _url):
        with trio.fail_after(BOUND):
            _, revision = await registry.list_prefix("m/")
            with pytest.raises(RegistryUnavailable, match="was reset"):
                async with registry.watch("m/", revision + 100) as batches:
                    await first_batch(batches)


@asynccontextmanager
async def grpc_proxy(etcd_url: str, data_dir: Path) -> AsyncIterator[tuple[str, int]]:
    """``etcd grpc-proxy start`` on loopback in front of ``etcd_url``: (its URL, its pid)."""
    listen = f"127.0.0.1:{free_port()}"
    argv = [ETCD_BIN, "grpc-proxy", "start", "--endpoints", etcd_url.removeprefix("http://"),
            "--listen-addr", listen, "--data-dir", str(data_dir)]  # fmt: skip
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with trio.fail_after(BOUND):
            while True:
                try:
                    with socket.create_connection(listen.split(":"), timeout=0.2):  # type: ignore[arg-type]
                        break
                except OSError:
                    await trio.sleep(0.1)
        yield f"http://{listen}", process.pid
    finally:
        process.kill()  # SIGKILL ends a stopped process too
        with trio.move_on_after(5):
            await process.wait()


async def test_a_watch_on_a_frozen_proxy_moves_to_the_next_by_its_keepalive(
    tmp_path: Path,
) -> None:
    """grpc-proxy drops progress requests and has no JSON gateway for the quiet check's
    read: the channel's keepalive pings find a frozen proxy, and the watch resumes on
    the next one without losing the event written meanwhile."""
    async with run_etcd(tmp_path / "etcd") as server:
        async with (
            grpc_proxy(server.url, tmp_path / "p1") as (first, first_pid),
            grpc_proxy(server.url, tmp_path / "p2") as (second, _),
        ):
            registry = GrpcWatchRegistry([server.url], watch_endpoints=(first, second))
            try:
                with trio.fail_after(BOUND):
                    _, revision = await registry.list_prefix("m/")
                async with registry.watch("m/", revision + 1) as batches:
                    os.kill(first_pid, signal.SIGSTOP)
                    await registry.create("m/written-while-frozen", b"1")
                    with trio.fail_after(PING_EVERY + PING_TIMEOUT + BOUND):
                        [event] = await first_batch(batches)
                assert event.key == "m/written-while-frozen"
            finally:
                await registry.aclose()
