"""The benchmark page's sections on faults and sites: etcd members lost
(``bench/etcd_faults.py``) and two sites behind NAT (``bench/bursting.py``).
"""

from __future__ import annotations

import math

from common import JSON
from report_format import failures_note, load_note, mmm, table, verdict


def etcd_faults_section(r: JSON | None, cost: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 7. etcd cluster faults (3 members)", ""]
    if r is None:
        return out + ["Not measured (run `bench/etcd_faults.py`).", ""], None
    p = r["params"]
    rows = [
        [fault, mmm(v["reached_after_fault_s"], 2), mmm(v["reached_after_start_s"], 2),
         mmm(v["dropped_after_stop_s"], 2), str(v["claims_lost"]), str(v["probes_lost"])]
        for fault, v in r["summary"].items()
    ]  # fmt: skip
    met = all(v["claims_lost"] == 0 and v["probes_lost"] == 0 for v in r["summary"].values())
    out += [
        f"Five pods, three etcd 3.4 members, real wireguard-go, lease TTL {p['ttl']} s;",
        "every daemon is given all three endpoints. Ranks 0-3 are meshed, the fault lasts",
        f"{p['duration']:g} s; {p['start_after']:g} s into it rank 4 is started and rank 3's"
        " pod killed. *Reached* = the fault's start (or rank 4's) → rank 4 and every",
        "running rank have reached each other over the overlay; *dropped* = rank 3's kill",
        "→ no running rank has it as a peer (a kill during a leader change also waits for",
        "the new leader, which renews every lease: up to TTL + 2 s). Median (min–max) over",
        "runs; claims and probes lost in all runs.",
        "",
        *table(
            [
                "fault",
                "reached after fault s",
                "after its start s",
                "dropped s",
                "claims lost",
                "probes lost",
            ],
            rows,
        ),  # fmt: skip
        "",
        f"Target: no claim and no probe lost — {verdict(met)}. Load: {load_note(r)}.",
        "",
    ]
    if cost is not None:
        c = cost["summary"]
        out += [
            f"What keeping {cost['params']['watchers']} member watches healthy costs one etcd"
            " (its CPU, share of a core, over "
            f"{cost['params']['window_s']:g} s): plain watches "
            f"{100 * c['plain']:.1f} %, leader-required {100 * c['leader']:.1f} %, as the "
            f"daemons keep them (leader-required, and a linearizable read when a watch is "
            f'quiet past its check: docs/architecture.md, "Watch") {100 * c["checked"]:.1f} %'
            f"{_checked_churn(cost)}; with a serializable read instead "
            f"{100 * c.get('serializable', math.nan):.1f} %.",
            "",
        ]
    return out + failures_note(r), met


def _checked_churn(cost: JSON) -> str:
    """The checked watches' requests, moves and re-opens (``watch_load.py``), if any."""
    run = next((x for x in cost["runs"] if x.get("mode") == "checked"), None)
    if run is None:
        return ""
    rps = run.get("requests_per_s")
    parts = [f"{rps:g} requests a second over the window" if rps is not None else ""]
    if run.get("watch_moves"):
        parts.append(f"{run['watch_moves']} moves")
    if run.get("watch_reopens"):
        parts.append(
            f"{run['watch_reopens']} watches opened again after a check got no "
            "answer (the loaded host's false alarms; a daemon lists and watches again)"
        )
    shown = "; ".join(part for part in parts if part)
    return f" ({shown})" if shown else ""


def bursting_section(r: JSON | None) -> list[str]:
    out = ["## 8. Bursting into a second site", ""]
    if r is None:
        return out + ["Not measured (run `bench/bursting.py`).", ""]
    s, p = r["summary"], r["params"]
    load = {k: mmm(v, 1) for k, v in s["loadavg_1m"].items()}
    out += [
        "Two sites behind their own NAT routers (`vnetd.lab.sites`): ranks 0-2 in site a,",
        "3-6 in site b, etcd on the public side, lease TTL "
        f"{p['lease_ttl_s']} s. Each run ({p['runs']}) has two phases in the same pods,",
        "alternating which goes first: **direct** (every member's port forwarded, each its",
        "own public endpoint) and **gateways** (only gateways 1 in a, 3 and 4 in b",
        "forwarded; 5 → 0 travels 5 → 3 → 1 → 0). Site a starts and meshes, then site b's",
        "ranks start (gateways first in that phase). Median (min–max); the last column",
        "is the 1-minute load average when the figure was taken. Start → readiness is the",
        "daemon's own start-up, which CPU load stretches; from readiness on it is the",
        "handshakes through the NATs (and gateways).",
        "",
        *table(
            ["site-b rank start → first reply from rank 0", "s", "load"],
            [
                ["direct, every rank", mmm(s["reach_direct_s"], 2), load["reach_direct"]],
                [
                    "gateways, the members",
                    mmm(s["reach_gateways_members_s"], 2),
                    load["reach_gateways"],
                ],
                [
                    "gateways, the gateways themselves",
                    mmm(s["reach_gateways_gateways_s"], 2),
                    load["reach_gateways"],
                ],
                [
                    "direct, from readiness (`claimed rank`)",
                    mmm(s["reach_direct_from_ready_s"], 2),
                    load["reach_direct"],
                ],
                [
                    "gateways, the members, from readiness",
                    mmm(s["reach_gateways_members_from_ready_s"], 2),
                    load["reach_gateways"],
                ],
            ],
        ),  # fmt: skip
        f"iperf3 TCP rank {p['iperf'][0]} (site b) → rank {p['iperf'][1]} (site a),"
        f" {p['seconds']:g} s each (first second omitted), Gbit/s; the ratio is per run. Every"
        " hop's wireguard-go shares the same 2 cores, so the relayed path pays its two extra"
        " decrypt-and-encrypt hops out of the CPU the endpoints also use:",
        "",
        *table(
            ["direct", "through the gateways", "ratio", "load (direct / gateways)"],
            [
                [
                    mmm(s["direct_gbps"], 3),
                    mmm(s["gateways_gbps"], 3),
                    mmm(s["ratio"], 2),
                    f"{load['iperf_direct']} / {load['iperf_gateways']}",
                ]
            ],
        ),  # fmt: skip
        f"Gateway {p['killed']} (site b's active one) killed by pid while every pod probes"
        f" every rank each {p['probe_interval_s']:g} s: the longest gap in replies of any"
        f" cross-site pair **{mmm(s['failover_gap_s'], 2)} s**; the last lost request was sent"
        f" {mmm(s['failover_resumed_s'], 2)} s after the kill (load {load['failover']}). The"
        " pause is the rest of the dead gateway's lease (renewed every TTL/3, so 2/3 TTL to one"
        " TTL after a crash): when its entry ends, every daemon moves its routes to the standby"
        " gateway.",
        "",
        f"Load: {load_note(r)}.",
        "",
    ]
    return out + failures_note(r)
