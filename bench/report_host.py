"""The benchmark page's sections on one host: a daemon's memory and idle CPU
(``bench/footprint.py``), its start-up (``bench/startup.py``), and throughput over the
overlay (``bench/dataplane.py``).
"""

from __future__ import annotations

from typing import Any

from common import JSON
from report_format import failures_note, load_note, mmm, num, plot, table, verdict


def footprint_section(r: JSON | None) -> tuple[list[str], list[bool | None]]:
    out = ["## 5. Footprint", ""]
    if r is None:
        return out + ["Not measured (run `bench/footprint.py`).", ""], [None, None]
    s = r["summary"]
    rows = [
        [peers, mmm(v["vnetd_rss_mib"]), mmm(v["vnetd_pss_mib"]), mmm(v["wg_rss_mib"]),
         mmm(v["wg_pss_mib"])]
        for peers, v in sorted(s["steps"].items(), key=lambda kv: int(kv[0]))
    ]  # fmt: skip
    rs = s["restart_1023"]
    rows.append(["1023, after a restart", mmm(rs["vnetd_rss_mib"]), "", mmm(rs["wg_rss_mib"]), ""])
    rss_1023 = s["steps"].get("1023", {}).get("vnetd_rss_mib", {}).get("max")
    wg_1023 = s["steps"].get("1023", {}).get("wg_rss_mib", {}).get("max")
    met_rss = None if rss_1023 is None else rss_1023 <= s["target_rss_mib"]
    idle = s["idle_vnetd_share"]["max"]
    met_idle = None if idle is None else idle <= s["target_idle_share"]
    p = r["params"]
    out += [
        f"One `vnetd up` (rank 0 of a {p['mesh_size']}-rank mesh) with peers registered",
        "straight into etcd (valid records, endpoints nobody answers; no traffic). MiB,",
        "median (min–max) over runs; RSS counts shared library pages in full, PSS splits them.",
        "",
        *table(["peers", "vnetd RSS", "vnetd PSS", "wireguard-go RSS", "wireguard-go PSS"], rows),
        f"Idle CPU over {p['idle_s']:g} s at 1023 peers ({_idle_work(p)}): vnetd "
        f"{mmm(s['idle_vnetd_share'], 2, 100, ' %')}, wireguard-go "
        f"{mmm(s['idle_wg_share'], 2, 100, ' %')} of a core. A restart with 1023 peers"
        f" registered reaches them all in {mmm(rs['to_all_peers_s'], 2, unit=' s')} (its first"
        f" pass: {mmm(rs['first_pass_ms'], 0, unit=' ms')}).",
        "",
        plot("footprint", lambda ax: _footprint_plot(ax, r), (6, 3.5)),
        "",
        f"Target: ≤ {s['target_rss_mib']:g} MiB resident with 1023 peers — {verdict(met_rss)} "
        "(vnetd "
        f"{num(rss_1023)} MiB; wireguard-go {num(wg_1023)} MiB more). Target: idle CPU ≤ 0.5 % "
        f"of a core — {verdict(met_idle)}. Load: {load_note(r)}.",
        "",
        *_footprint_why(s),
        *_footprint_largest(r),
        *failures_note(r),
    ]
    return out, [met_rss, met_idle]


def _footprint_largest(r: JSON) -> list[str]:
    """The step of a mesh larger than 1024 (``footprint.py --size``), when one was run."""
    big = r["summary"].get("largest")
    if big is None or big["peers"] <= 1023:
        return []
    n, p = big["peers"], r["params"]
    rest = p.get("largest", p)
    return [
        f"At {n} peers (rank 0 of a {n + 1}-rank mesh, the last step of the same runs): "
        f"vnetd {mmm(big['vnetd_rss_mib'], 1, unit=' MiB')} resident "
        f"({mmm(big['vnetd_pss_mib'], 1, unit=' MiB')} PSS), wireguard-go "
        f"{mmm(big['wg_rss_mib'], 1, unit=' MiB')}; the start reaches every peer on the "
        f"device in {mmm(big['to_all_peers_s'], 1, unit=' s')} (the daemon's CPU by then: "
        f"{mmm(big.get('cpu_to_all_peers_s'), 1, unit=' s')}, its first pass "
        f"{mmm(big['first_pass_ms'], 0, unit=' ms')}), with "
        f"{mmm(big.get('device_routes'), 0)} routes through the device, and the device's peers "
        f"counted with `wg show`. Idle CPU over {p['idle_s']:g} s there ({_idle_work(rest)}):"
        " vnetd "
        f"{mmm(big['idle_vnetd_share'], 2, 100, ' %')}, wireguard-go "
        f"{mmm(big['idle_wg_share'], 2, 100, ' %')} of a core (no member answers, so no "
        "handshake or keepalive is in it). The kernel data plane is not measured at this "
        "size: the guest bench holds 1023 peers (bench/README.md, kernel_guest.py).",
        "",
    ]


def startup_section(r: JSON | None) -> tuple[list[str], bool | None]:
    """``bench/startup.py``: ``vnetd up`` starting → the rank's address on its interface."""
    out = ["## Start-up", ""]
    if r is None:
        return out + ["Not measured (run `bench/startup.py`).", ""], None
    s = r["summary"]
    rows = [
        [label, mmm(part["address_s"], 0, 1000, " ms"), mmm(part.get("cpu_at_address_s"), 0, 1000,
         " ms"), mmm(part["logged_starting_s"], 0, 1000, " ms"), mmm(part["claimed_s"], 0, 1000,
         " ms")]
        for label, part in (("every start", s["all"]), ("key already made", s["key_kept"]))
    ]  # fmt: skip
    worst = s["all"]["address_s"]["max"]
    ok = None if worst is None else worst <= s["target_address_s"]
    out += [
        f"`vnetd up` for one rank started {r['params']['runs']} times in a row in a lab pod",
        "(the first start also makes its key); from the process's spawn to the kernel",
        "announcing the rank's address on the interface (what a launcher waits on), to the",
        "daemon's `starting:` line (imports, settings, identity done) and to its claim.",
        "Median (min–max).",
        "",
        *table(
            [
                "",
                "address on the interface",
                "its CPU by then",
                "`starting:` logged",
                "rank claimed",
            ],
            rows,
        ),  # fmt: skip
        f"Target: address ≤ {s['target_address_s'] * 1000:.0f} ms after the start, every"
        f" start — {verdict(ok)}. Load: {load_note(r)}.",
        "",
        *failures_note(r),
    ]
    return out, ok


def _footprint_why(s: JSON) -> list[str]:
    one = s["steps"].get("1", {}).get("vnetd_rss_mib", {}).get("median")
    full = s["steps"].get("1023", {}).get("vnetd_rss_mib", {}).get("median")
    if one is None or full is None:
        return []
    return [
        f"Where the memory is: with one peer vnetd is already {num(one)} MiB resident, the "
        "Python interpreter (10 MiB) and the libraries it imports at start (measured one by one "
        "in a fresh interpreter: trio +11 MiB, pyroute2 +12 MiB with its package importing "
        "all of its modules, httpx +3, cryptography +1, prometheus-client +1); 1022 more peers "
        f"add {num(full - one)} MiB. The peers' cost is in wireguard-go. vnetd now imports "
        "only the pyroute2 modules it uses (its package __init__ deferred: 6 MiB less), and "
        "prometheus-client and the HTTP server only with [http] listen (docs/architecture.md, "
        "Start-up).",
        "",
    ]


def _footprint_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    steps = r["summary"]["steps"]
    xs = [int(p) for p in steps]
    for key, label in (("vnetd_rss_mib", "vnetd RSS"), ("wg_rss_mib", "wireguard-go RSS"),
                       ("vnetd_pss_mib", "vnetd PSS")):  # fmt: skip
        ax.plot(xs, [steps[p][key]["median"] for p in steps], "o-", label=label)
    ax.axhline(50, color="grey", linestyle=":", label="target (vnetd)")
    ax.set_xscale("log")
    ax.set_xlabel("peers configured")
    ax.set_ylabel("MiB")
    ax.set_title("Resident memory")
    ax.legend(fontsize=8)


def dataplane_section(r: JSON | None) -> tuple[list[str], bool | None]:
    out = ["## 6. Data plane", ""]
    if r is None:
        return out + ["Not measured (run `bench/dataplane.py`).", ""], None
    s = r["summary"]
    p = r["params"]
    ratio = s["ratio"]["min"]
    met = None if ratio is None else ratio >= s["target_ratio"]
    out += [
        "iperf3 TCP, pod 0 → pod 1, the same two pods at the same time: over vnetd's overlay",
        "and over a second wireguard-go (same binary) configured by hand with `wg`, alternating,"
        f" {p['rounds']} × {p['seconds']:g} s each per run (first second omitted), MTU 1420 on",
        "both. Gbit/s, median (min–max) over all tests; the ratio is per run (medians).",
        "",
        *table(
            ["vnetd overlay", "hand-made wireguard-go", "ratio", "underlay (veth)"],
            [
                [
                    mmm(s["vnetd_gbps"], 3),
                    mmm(s["hand_gbps"], 3),
                    mmm(s["ratio"], 3),
                    mmm(s["underlay_gbps"], 1),
                ]
            ],
        ),  # fmt: skip
        f"One peer change on a device with {p['peers_for_change']} peers, ms, median (min–max):",
        "",
        *table(
            [
                "vnetd: the whole reconcile pass (an endpoint moved)",
                "UAPI `set`, one peer updated",
                "UAPI add + remove one peer",
                "full replace (`replace_peers`, all peers)",
                "UAPI `get` (whole device)",
            ],
            [
                [
                    mmm(s["vnetd_pass_ms"]),
                    mmm(s["uapi_update_ms"], 2),
                    mmm(s["uapi_add_remove_ms"], 2),
                    mmm(s["uapi_replace_ms"]),
                    mmm(s["uapi_get_ms"], 2),
                ]
            ],
        ),  # fmt: skip
        *_connection_line(s),
        "A live session with the other pod "
        + ("survives" if s["session_kept_after_update"] else "**does not survive**")
        + " the incremental updates and "
        + ("survives" if s["session_kept_after_replace"] else "is **dropped** by")
        + " the full replace (every tunnel has to handshake again).",
        "",
        plot("dataplane", lambda ax: _dataplane_plot(ax, r), (6, 3.5)),
        "",
        f"Target: throughput ratio ≥ 0.97 (every run) — {verdict(met)}. Load: {load_note(r)}.",
        "",
        *_dataplane_why(s),
        *failures_note(r),
    ]
    return out, met


def _connection_line(s: JSON) -> list[str]:
    """What one ``set`` costs on a new UAPI connection and on a kept one (results from
    before bench/uapi_cost.py timed both have neither)."""
    if "uapi_update_kept_ms" not in s:
        return []
    return [
        "The same one-peer `set` on a connection kept open (as the daemon keeps it): "
        f"{mmm(s['uapi_update_kept_ms'], 2)} ms wall and {mmm(s['uapi_update_kept_cpu_ms'], 2)} "
        f"ms of the client's CPU, against {mmm(s['uapi_update_ms'], 2)} ms and "
        f"{mmm(s['uapi_update_cpu_ms'], 2)} ms on a new connection.",
        "",
    ]


def _dataplane_why(s: JSON) -> list[str]:
    notes = []
    for side, name in (("vnetd_gbps", "vnetd"), ("hand_gbps", "hand-made")):
        v = s[side]
        if v.get("min"):
            notes.append(f"{name} {num((v['max'] / v['min'] - 1) * 100, 0)} %")
    return [
        "Both sides are the same wireguard-go binary with the same MTU between the same "
        "pods; vnetd is not on the packet path. Between tests of one side, throughput varies "
        "by (max/min - 1): " + ", ".join(notes) + ", which bounds how exactly the ratio is "
        "known on 2 shared cores.",
        "",
    ]


def _dataplane_plot(ax: Any, r: JSON) -> None:  # noqa: ANN401
    data = {side: [x for run in r["runs"] for x in run["gbps"][side]] for side in ("vnetd", "hand")}
    ax.boxplot(list(data.values()))
    ax.set_xticks([1, 2], ["vnetd overlay", "hand-made wireguard-go"])
    ax.set_ylabel("Gbit/s")
    ax.set_title("iperf3 TCP between two pods")


def _idle_work(p: JSON) -> str:
    """What the daemon does at rest in the idle window, as the run recorded it (runs
    before the spacing by mesh size recorded only the fixed periods)."""
    if "resync_every_s" not in p:
        return f"keepalives, a resync every {p['resync_s']} s, the watch resumed every 60 s"
    return (f"a keepalive every {p['keepalive_s']:g} s, a full pass every "
            f"{p['resync_every_s']:g} s, the watch resumed every {p['watch_restart_s']:g} s "
            "or up to a quarter sooner")  # fmt: skip
