"""The lab probe counts each lost request of an established pair, and the lab reads it back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vnetd.lab import probe as probe_module
from vnetd.lab.cluster import MeshLab, write_spec
from vnetd.lab.probe import MAGIC, Prober
from vnetd.spec import load_spec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Socket:
    """Records what was sent; ``fail`` makes sends raise as with no route."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.fail = False

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.fail:
            raise OSError(113, "No route to host")
        self.sent.append((data, addr))


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(probe_module.time, "monotonic", fake)
    return fake


def events(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def reply(prober: Prober, target: str, seq: int) -> None:
    prober.handle(Socket(), b"%s rep %d %s" % (MAGIC, seq, target.encode()), (target, 7777))


def test_misses_count_only_unanswered_requests_after_the_first_reply(clock, capsys):
    prober = Prober("10.0.0.1", ["10.0.0.2"], 7777, lost_after=1.0, miss_after=1.0)
    sock = Socket()
    for seq in range(3):  # not reached yet: silence before the first reply is no loss
        prober.send_round(sock, seq)
        clock.now += 0.1
    reply(prober, "10.0.0.2", 2)
    prober.send_round(sock, 3)  # answered
    reply(prober, "10.0.0.2", 3)
    clock.now += 0.1
    prober.send_round(sock, 4)  # lost
    clock.now += 0.1
    sock.fail = True
    prober.send_round(sock, 5)  # a failed send of an established pair is lost too
    clock.now += 0.5
    prober.check_missed()
    assert [e["event"] for e in events(capsys)] == ["reached"], "not late yet"
    clock.now += 1.0
    prober.check_missed()
    missed = [e for e in events(capsys) if e["event"] == "miss"]
    assert [(e["target"], e["seq"]) for e in missed] == [("10.0.0.2", 4), ("10.0.0.2", 5)]
    assert missed[0]["sent"] == pytest.approx(100.4)
    prober.check_missed()
    assert events(capsys) == [], "each lost request is reported once"
    assert prober.counters()["received"] == {"10.0.0.2": 2}


def test_mesh_lab_counts_losses_and_replies_per_pair_in_a_window(tmp_path):
    spec = load_spec(write_spec(tmp_path / "mesh.toml", 3, "http://127.0.0.1:2379"))
    mesh = MeshLab(lab=SimpleNamespace(), spec_path=tmp_path / "mesh.toml", spec=spec)
    a1, a2 = mesh.address(1), mesh.address(2)
    lines = {
        0: [
            {"event": "counters", "sent": {a1: 10, a2: 10}, "received": {a1: 10, a2: 9}, "t": 1.0},
            {"event": "miss", "target": a2, "seq": 12, "sent": 1.2, "t": 2.3},
            {"event": "miss", "target": a2, "seq": 13, "sent": 1.3, "t": 2.4},
            {"event": "miss", "target": a1, "seq": 40, "sent": 4.0, "t": 5.1},
            {"event": "counters", "sent": {a1: 20, a2: 20}, "received": {a1: 20, a2: 17}, "t": 2.0},
        ],
        1: ["not json", {"event": "miss", "target": mesh.address(0), "seq": 1, "sent": 1.5}],
    }
    mesh.probes = {
        src: SimpleNamespace(log_text=lambda rows=rows: "\n".join(
            row if isinstance(row, str) else json.dumps(row) for row in rows
        ))
        for src, rows in lines.items()
    }  # fmt: skip
    assert mesh.probe_misses(1.0, 3.0) == {(0, 2): 2, (1, 0): 1}
    assert mesh.probe_misses(1.0, 3.0, ranks={0, 2}) == {(0, 2): 2}
    assert mesh.probe_misses(0.0) == {(0, 1): 1, (0, 2): 2, (1, 0): 1}
    assert mesh.probe_received(0.5, 2.5) == {(0, 1): 10, (0, 2): 8}
