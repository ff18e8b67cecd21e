#!/usr/bin/env python3
"""Many simulated vnetd daemons in one trio process, fake data plane, real etcd; run in a lab pod.

    sim_ranks.py --config mesh.toml --ranks 0-255 --state-root DIR [--stagger 0.005]

Each rank is a whole ``vnetd.daemon.root.run_daemon`` (spec check, claim under a
lease with keepalive, list-then-watch, reconciler) with its own etcd client
(the clients share one TLS context, as ``sharing_tls`` lets a process),
state dir (key) and instance name; only the device is the in-memory
``FakeDataplane``, wrapped to note when it first holds every other rank of
the spec. One JSON line per event on stdout (``t``: wall clock, epoch s):

- ``{"event": "claimed", "rank": R, "t": T, "started": S, "cpu": C}`` when a daemon's
  claim is in etcd (``S``: when its ``run_daemon`` was started; ``C``: this process's
  CPU seconds when that was seen);
- ``{"event": "full", "rank": R, "t": T, "cpu": C}`` when its device first holds N-1 peers;
- ``{"event": "progress", "claimed": n, "full": n, "cpu": s, "t": T}`` every second,
  ``cpu`` being this process's CPU seconds so far.

Runs until SIGTERM. The daemons' own logs are off (WARNING and above go to
stderr): at 1024 ranks they would log a million "peer joined" lines. With
``BENCH_PROFILE=DIR`` in the environment it runs under cProfile and leaves
``DIR/sim-<pid>.prof``.

The daemons of one process share their records' signature checks
(``SharedProofs``; ``--own-proofs``: each checks its own, as in production).
On a cluster each daemon verifies each of its N-1 peers' records once, on its
own core (111 µs a record here, ``bench/record_proof.py``; ``join_storm.py``
measures one daemon's whole join cost with it), and while the storm lasts; a
process here packs 256 daemons onto a share of 2 cores, so the same 1023
records verified by every one of 1024 daemons cost 1024 × 1023 × 111 µs, about
116 s of the two cores: enough to starve keepalives until leases expire, and
the 1024 run stopped converging when signed records came. Shared, each
distinct record is verified once per process, and the progress lines carry
the count of checks answered from the cache (``proofs_shared``), the count
verified (``proofs_verified``) and their CPU (``proofs_cpu``), so
``control_plane.py`` adds the shared checks' cost back, at the measured rate,
to the CPU a daemon needs. With ``--own-proofs`` nothing is shared but every
check is still timed: the progress lines, and the ``claimed`` and ``full``
lines, carry ``proofs_cpu``: the process's total so far, every daemon of it
(``join_storm.py`` runs one, and splits its CPU with it). They also carry the
CPU the fake devices' ``apply`` took (``device_cpu``: a real daemon makes the
UAPI or netlink write there instead), the member watch streams opened
(``watch_opens``: a storm's batches are one resume each) and the reconciler
passes (``passes``) so far.

With ``--rank-ca-key FILE`` (a mesh whose spec pins that CA in ``[mesh] rank_ca``)
each daemon gets a signing key and a rank certificate from that CA in its state
dir, as ``vnetd rank-cert`` issues one, and every certificate check the process
makes is timed too: ``certs_cpu`` (parsing and verifying a certificate not seen
before, ``control.rank_cert.read_cert``; a cached one is a lookup) and
``certs_verified`` ride with ``proofs_cpu``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from collections.abc import Set as AbstractSet
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from functools import partial
from ipaddress import ip_network
from pathlib import Path
from typing import ClassVar

import trio

from vnetd.config import DEFAULT_RESYNC_INTERVAL, Settings
from vnetd.control import membership, rank_cert
from vnetd.control.proof import create_signer_file, load_signer
from vnetd.daemon.root import run_daemon
from vnetd.daemon.running import Running
from vnetd.daemon_settings import resolve_daemon_settings
from vnetd.dataplane.base import DeviceConfig
from vnetd.dataplane.fake import FakeDataplane
from vnetd.identity import resolve_endpoint
from vnetd.model import Plan
from vnetd.ranks import parse_ranks
from vnetd.registry import RegistryOpener, sharing_tls
from vnetd.registry.etcd.client import EtcdRegistry
from vnetd.spec import load_spec


def emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CountingDataplane(FakeDataplane):
    """A ``FakeDataplane`` that reports when it first holds ``want`` peers.

    It also indexes which peer holds each allowed IP: the stock fake finds
    the previous holder, and the IPs still held after a plan, by scanning
    every peer, so a daemon of a 1024-rank mesh would spend more CPU in the
    fake (O(peers) per plan, O(peers²) to take a join) than in its own
    pass. The semantics are the same: an allowed IP belongs to one peer, the
    last one given it. Allowed IPs are the spec's, already in normal form.
    """

    def __init__(self, config: DeviceConfig, rank: int, want: int, state: Counters) -> None:
        super().__init__(config)
        self.rank = rank
        self.want = want
        self.state = state
        self.full = False
        self._owner: dict[str, str] = {}
        """Allowed IP -> the peer that holds it now (exactly: kept on every change)."""

    _normal: ClassVar[dict[str, str]] = {}
    """Allowed IP as given -> its normal form, shared by every daemon of the process."""

    def _cidr(self, ip: str) -> str:
        found = self._normal.get(ip)
        if found is None:
            found = self._normal[ip] = str(ip_network(ip, strict=False))
        return found

    def _release(self, public_key: str, ips: Iterable[str]) -> None:
        for ip in ips:
            if self._owner.get(ip) == public_key:
                del self._owner[ip]

    def _assign(self, public_key: str, allowed_ips: Iterable[str]) -> None:
        wanted = {self._cidr(ip) for ip in allowed_ips}
        mine = self.device[public_key]
        self._release(public_key, set(mine.allowed_ips) - wanted)
        for ip in wanted:
            owner = self._owner.get(ip)
            if owner is not None and owner != public_key:
                peer = self.device.get(owner)
                if peer is not None and ip in peer.allowed_ips:
                    kept = tuple(x for x in peer.allowed_ips if x != ip)
                    self.device[owner] = replace(peer, allowed_ips=kept)
            self._owner[ip] = public_key
        self.device[public_key] = replace(mine, allowed_ips=tuple(sorted(wanted)))

    def _live_ips(self) -> AbstractSet[str]:
        return self._owner.keys()

    async def apply(self, plan: Plan) -> None:
        started = time.process_time()
        for removed in plan.remove:
            held = self.device.get(removed.public_key)
            if held is not None:
                self._release(removed.public_key, held.allowed_ips)
        await super().apply(plan)  # all in memory: it never waits
        self.state.device_cpu += time.process_time() - started
        if not self.full and len(self.device) >= self.want:
            self.full = True
            self.state.full += 1
            emit({"event": "full", "rank": self.rank, "t": time.time(), "cpu": cpu_seconds(),
                  **self.state.costs()})  # fmt: skip


class Counters:
    def __init__(self, proofs: SharedProofs) -> None:
        self.claimed = 0
        self.full = 0
        self.proofs = proofs
        self.device_cpu = 0.0
        """CPU seconds the fake devices' ``apply`` took, every daemon of the process."""
        self.watch_opens = 0
        """Member watch streams opened (each resume of a storm's batches is one)."""
        self.running: list[Running] = []
        self.certs_cpu = 0.0
        """CPU seconds the rank certificates' first checks took, every daemon of the process."""
        self.certs_verified = 0

    def costs(self) -> dict[str, float | int]:
        """What the progress, claimed and full lines carry of the process's work so far."""
        return {"proofs_cpu": round(self.proofs.cpu, 4), "device_cpu": round(self.device_cpu, 4),
                "certs_cpu": round(self.certs_cpu, 4), "certs_verified": self.certs_verified,
                "watch_opens": self.watch_opens,
                "passes": sum(r.reconciler.stats.runs for r in self.running)}  # fmt: skip


class SharedProofs:
    """``membership.verify`` for every daemon of this process, each distinct
    (signing key, proof, registry key, lease, record) verified once (module
    docstring); ``share=False``: every check verified, as each daemon does alone,
    and timed. Only a proof that verifies is kept: a bad one is checked again
    each time, as each daemon would. At most ``KEEP`` kept, then started over."""

    KEEP = 1 << 16

    def __init__(
        self, verify: Callable[[str, str, str, int, bytes], bool], *, share: bool = True
    ) -> None:
        self._verify = verify
        self._share = share
        self._good: set[tuple[str, str, str, int, bytes]] = set()
        self.shared = self.verified = 0
        self.cpu = 0.0

    def __call__(self, signing_key: str, proof: str, key: str, lease: int, body: bytes) -> bool:
        memo = (signing_key, proof, key, lease, body)
        if memo in self._good:
            self.shared += 1
            return True
        t0 = time.process_time()
        good = self._verify(signing_key, proof, key, lease, body)
        self.cpu += time.process_time() - t0
        self.verified += 1
        if good and self._share:
            if len(self._good) >= self.KEEP:
                self._good.clear()
            self._good.add(memo)
        return good


def count_watch_opens(state: Counters) -> None:
    """Count every member watch stream the process's daemons open (bench only, like
    ``SharedProofs``: the counter wraps ``EtcdRegistry.open_watch_stream``)."""
    opener = EtcdRegistry.open_watch_stream

    async def counted(
        self: EtcdRegistry, stack: AsyncExitStack, body: dict[str, object]
    ) -> tuple[str, AsyncIterator[str]]:
        state.watch_opens += 1
        return await opener(self, stack, body)

    EtcdRegistry.open_watch_stream = counted  # type: ignore[method-assign]


def time_cert_checks(state: Counters) -> None:
    """Time every certificate the process parses and verifies (bench only: the wrap
    replaces ``rank_cert.read_cert``, which ``CertCache.lookup`` calls on a miss)."""
    read = rank_cert.read_cert

    def timed(der: bytes, rank_ca: tuple[str, ...]) -> rank_cert.RankCert | str:
        t0 = time.process_time()
        try:
            return read(der, rank_ca)
        finally:
            state.certs_cpu += time.process_time() - t0
            state.certs_verified += 1

    rank_cert.read_cert = timed  # type: ignore[assignment]


def rank_cert_file(ca_key: Path, config: Path, rank: int, state_dir: Path) -> Path:
    """A signing key (``signing.key``, the daemon's default) and a rank certificate for
    ``rank`` from the CA in ``ca_key``, in ``state_dir``; the certificate's path."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key, cert = state_dir / "signing.key", state_dir / "rank.crt"
    if not cert.exists():
        signer = create_signer_file(key, "bench")
        uri = rank_cert.rank_uri(load_spec(config).name, rank)
        cert.write_bytes(rank_cert.issue(load_signer(ca_key), signer.public_key, uri, days=1))
    return cert


def endpoint_ip(rank: int) -> str:
    """A distinct underlay address per rank, inside 198.18.0.0/15 (only registered, never
    sent to: the data plane is fake)."""
    return f"198.19.{rank // 256}.{rank % 256}"


async def main_async(args: argparse.Namespace) -> None:
    spec = load_spec(args.config)
    ranks = parse_ranks(args.ranks, spec.size)
    proofs = SharedProofs(membership.verify, share=not args.own_proofs)
    membership.verify = proofs  # type: ignore[assignment]  # bench only: module docstring
    state = Counters(proofs)
    count_watch_opens(state)
    time_cert_checks(state)
    opener = sharing_tls()  # one TLS context for every daemon's etcd client
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, signals, nursery.cancel_scope)
            nursery.start_soon(_progress, state, len(ranks), proofs)
            emit({"event": "starting", "ranks": len(ranks), "t": time.time()})
            for rank in ranks:
                nursery.start_soon(_one, rank, args, spec.size, state, opener)
                if args.stagger:
                    await trio.sleep(args.stagger)


async def _one(
    rank: int, args: argparse.Namespace, size: int, state: Counters, opener: RegistryOpener
) -> None:
    state_dir = args.state_root / f"rank{rank}"
    ca_key = args.rank_ca_key
    cert = rank_cert_file(ca_key, args.config, rank, state_dir) if ca_key else None
    opts = Settings(
        spec=load_spec(args.config),
        rank=str(rank),
        state_dir=state_dir,
        instance=f"sim-{rank}",
        dataplane="fake",
        resync_interval=args.resync,
        rank_cert_file=str(cert) if cert else None,
    )
    env = {"POD_IP": endpoint_ip(rank), "POD_NAME": f"sim-{rank}"}
    endpoint = resolve_endpoint(opts.spec, None, env, None)
    assert isinstance(opts.spec.mtu, int)  # auto reads the host's underlay
    settings = resolve_daemon_settings(
        opts, env, hostname=f"sim-{rank}", rank=rank, endpoint=endpoint, mtu=opts.spec.mtu
    )

    @asynccontextmanager
    async def dataplane(device: DeviceConfig) -> AsyncIterator[CountingDataplane]:
        fake = CountingDataplane(device, rank, size - 1, state)
        try:
            yield fake
        finally:
            fake.close()

    started = time.time()
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(
            partial(run_daemon, settings, open_dataplane=dataplane, open_registry=opener)
        )
        with trio.fail_after(600):
            await running.claim.claimed.wait()
        state.claimed += 1
        state.running.append(running)
        claimed = running.claim.claimed_at or time.time()
        emit({"event": "claimed", "rank": rank, "t": claimed, "started": started,
              "cpu": cpu_seconds(), **state.costs()})  # fmt: skip


async def _progress(state: Counters, total: int, proofs: SharedProofs) -> None:
    while True:
        shared = {"proofs_shared": proofs.shared, "proofs_verified": proofs.verified,
                  **state.costs()}  # fmt: skip
        emit({"event": "progress", "claimed": state.claimed, "full": state.full, "of": total,
              "cpu": round(cpu_seconds(), 3), "t": time.time(), **shared})  # fmt: skip
        await trio.sleep(1.0)


async def _stop_on_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--ranks", required=True, help="e.g. 0-255")
    parser.add_argument("--state-root", type=Path, required=True)
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between starts")
    parser.add_argument("--resync", type=float, default=DEFAULT_RESYNC_INTERVAL,
                        help="--resync-interval")  # fmt: skip
    parser.add_argument("--own-proofs", action="store_true",
                        help="each daemon checks every record itself (docstring)")  # fmt: skip
    parser.add_argument("--rank-ca-key", type=Path,
                        help="the CA key the spec's [mesh] rank_ca pins: each daemon gets a "
                        "rank certificate from it (docstring)")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")  # fmt: skip
    profile_dir = os.environ.get("BENCH_PROFILE")
    if not profile_dir:
        trio.run(main_async, args)
        return 0
    import cProfile  # where does a process of simulated daemons spend its CPU?

    profiler = cProfile.Profile()
    try:
        profiler.runcall(trio.run, main_async, args)
    finally:
        profiler.dump_stats(Path(profile_dir) / f"sim-{os.getpid()}.prof")
    return 0


if __name__ == "__main__":
    sys.exit(main())
