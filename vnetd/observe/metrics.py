"""Prometheus metrics of one daemon, served at ``/metrics``.

Every metric lives in a ``CollectorRegistry`` of the daemon's own (tests run
several daemons in one process). Most values are read from the daemon's
components at scrape time by one custom collector, so the components keep
plain counters and know nothing of Prometheus; only the two histograms are
observed as passes happen. ``docs/operations.md`` lists every metric.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vnetd.model import DevicePeer

HANDSHAKE_FRESH = 180.0
"""A handshake younger than this means the pair is talking (WireGuard rekeys every 120 s)."""


@dataclass
class Snapshot:
    """What the collector reports; filled by ``DaemonMetrics.refresh`` before a scrape."""

    members: int = 0
    peers: dict[str, DevicePeer] = field(default_factory=dict)
    peer_ranks: Mapping[str, int] = field(default_factory=dict)
    reconcile_runs: int = 0
    reconcile_failures: int = 0
    handshakes_initiated: int = 0
    doorbell_rings: int = 0
    doorbell_rings_dropped: int = 0
    bad_entries: int = 0
    watch_restarts: int = 0
    claims: int = 0
    refused_rewrites: int = 0
    displaced: int = 0
    restores: int = 0
    spec_differs: bool = False
    registry_errors: Mapping[str, int] = field(default_factory=dict)
    registry_full: bool = False
    registry_full_refusals: int = 0
    wireguard_restarts: int = 0
    held_by: Mapping[str, object] | None = None
    """Who holds our rank while our claim waits (``/status`` ``self.held_by``)."""
    now: float = 0.0


class _SnapshotCollector(Collector):
    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.snapshot
        yield _gauge("vnetd_members_registered", "Ranks with a valid registry entry.", s.members)
        yield _gauge("vnetd_peers_configured", "WireGuard peers on this device.", len(s.peers))
        ages_now = [s.now - p.last_handshake for p in s.peers.values() if p.last_handshake]
        fresh = sum(1 for age in ages_now if age < HANDSHAKE_FRESH)
        yield _gauge(
            "vnetd_peers_handshake_fresh",
            f"Peers whose last handshake is younger than {HANDSHAKE_FRESH:.0f} s.",
            fresh,
        )
        ages = GaugeMetricFamily(
            "vnetd_peer_last_handshake_seconds",
            "Seconds since the last handshake with each peer (absent: never).",
            labels=["rank"],
        )
        for key, peer in sorted(s.peers.items(), key=lambda kv: s.peer_ranks.get(kv[0], -1)):
            rank = s.peer_ranks.get(key)
            if rank is not None and peer.last_handshake:
                ages.add_metric([str(rank)], max(0.0, s.now - peer.last_handshake))
        yield ages
        yield _counter("vnetd_reconcile_runs", "Reconcile passes.", s.reconcile_runs)
        yield _counter(
            "vnetd_reconcile_failures",
            "Passes whose plan the device refused.",
            s.reconcile_failures,
        )
        yield _counter(
            "vnetd_handshakes_initiated",
            "Handshakes this daemon started itself: eager pairs, retries and re-adds (a lazy "
            "pair's first packet starts its own, through a doorbell ring or not).",
            s.handshakes_initiated,
        )
        yield _counter(
            "vnetd_doorbell_rings",
            "First handshakes of lazy pairs' responders taken on the doorbell port.",
            s.doorbell_rings,
        )
        yield _counter(
            "vnetd_doorbell_rings_dropped",
            "Of those, rings dropped unlooked-at: from an endpoint that rang under 1 s ago, or "
            "while 4,096 rings are held (a flood).",
            s.doorbell_rings_dropped,
        )
        errors = CounterMetricFamily(
            "vnetd_registry_errors",
            "Failed registry calls, by operation.",
            labels=["operation"],
        )
        for operation, count in sorted(s.registry_errors.items()):
            errors.add_metric([operation], count)
        yield errors
        yield _gauge(
            "vnetd_registry_full",
            "1 while the registry refuses this daemon's writes for space (etcd's NOSPACE "
            "alarm): a claim or record update waits, the data plane stays as it is.",
            int(s.registry_full),
        )
        yield _counter(
            "vnetd_registry_full_refusals",
            "Writes (claims, record updates, lease grants) the registry refused for space.",
            s.registry_full_refusals,
        )
        yield _counter(
            "vnetd_registry_bad_entries", "Registry entries skipped as invalid.", s.bad_entries
        )
        yield _counter(
            "vnetd_watch_restarts", "Times the member watch was listed again.", s.watch_restarts
        )
        yield _counter(
            "vnetd_lease_reclaims",
            "Claims after the first (the lease was lost and the rank claimed again).",
            max(0, s.claims - 1),
        )
        yield _counter(
            "vnetd_registry_refused_writes",
            "Registry entries refused as forgeries: a rewrite of a held entry not made by "
            "its holder, a copy of a public key registered under another signing key, or a "
            "replay of a holder's older record.",
            s.refused_rewrites,
        )
        yield _counter(
            "vnetd_claim_displaced",
            "Times another holder took this rank while our lease lived.",
            s.displaced,
        )
        yield _counter(
            "vnetd_claim_restores",
            "Times our entry, overwritten by another writer, was written back.",
            s.restores,
        )
        held = GaugeMetricFamily(
            "vnetd_claim_held_seconds",
            "While our claim waits: seconds since we found the rank held by another entry, "
            "labelled with its instance, signing key prefix and lease (absent: not waiting).",
            labels=["instance", "signing_key", "lease"],
        )
        if s.held_by is not None:
            labels = [str(s.held_by[name]) for name in ("instance", "signing_key", "lease")]
            held.add_metric(labels, float(str(s.held_by["held_for_s"])))
        yield held
        yield _gauge(
            "vnetd_spec_differs",
            "1 while the spec stored in the registry differs from the one this daemon "
            "checked at start (it runs on with its own; a new start exits).",
            int(s.spec_differs),
        )
        yield _counter(
            "vnetd_wireguard_restarts",
            "Times wireguard-go died and was started again.",
            s.wireguard_restarts,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class DaemonMetrics:
    """The metrics of one daemon."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = _SnapshotCollector()
        self.registry.register(self._collector)
        self.reconcile_duration = Histogram(
            "vnetd_reconcile_duration_seconds",
            "Time of one reconcile pass (read the device, diff, apply).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.plan_size = Histogram(
            "vnetd_plan_changes",
            "Peer changes (adds, updates, removes) in each applied plan.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )

        self.black_holes = Gauge(
            "vnetd_black_hole_peers",
            "Peers whose route MTU this daemon locked after a probe found a path-MTU black "
            "hole (small packets pass, full-size ones do not).",
            registry=self.registry,
        )

    def observe_pass(self, duration: float, changes: int) -> None:
        """Record one reconcile pass; ``changes`` is 0 when nothing was applied."""
        self.reconcile_duration.observe(duration)
        if changes:
            self.plan_size.observe(changes)

    def update(self, snapshot: Snapshot) -> None:
        if not snapshot.now:
            snapshot.now = time.time()
        self._collector.snapshot = snapshot

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
