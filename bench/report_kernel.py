"""The ``kernel_guest`` section of docs/benchmarks.md (bench/kernel_guest.py's result):
kernel WireGuard against wireguard-go, both measured in one boot of the QEMU kernel guest."""

from __future__ import annotations

from common import JSON
from report_format import failures_note, load_note, mmm, num, table


def kernel_guest_section(r: JSON | None) -> list[str]:
    out = ["## Kernel WireGuard against wireguard-go (kernel guest)", ""]
    if r is None:
        return out + ["Not measured (run `bench/kernel_guest.py`).", ""]
    s, p = r["summary"], r["params"]
    guest = p["guest"]
    change, join = s["change"], s["join"]
    lat, jpass = join["latency_ms"], join["pass_ms"]
    rows = [
        [f"one change at {change['peers']} peers: the daemon's whole pass, ms",
         mmm(change["pass_ms"]["kernel"]), mmm(change["pass_ms"]["userspace"]),
         num(change["ratio"], 2)],
        [f"join propagation at {join['ranks']} ranks, p50 ms", num(lat["kernel"]["p50"]),
         num(lat["userspace"]["p50"]), num(join["ratio_p50"], 2)],
        [f"join propagation at {join['ranks']} ranks, p90 ms", num(lat["kernel"]["p90"]),
         num(lat["userspace"]["p90"]), num(join["ratio_p90"], 2)],
        ["the join's reconcile pass, p50 ms", num(jpass["kernel"]["p50"]),
         num(jpass["userspace"]["p50"]), num(join["pass_ratio_p50"], 2)],
        [f"rank 0 started → {change['peers']} peers on its device, s",
         mmm(change["full_s"]["kernel"]), mmm(change["full_s"]["userspace"]), ""],
    ]  # fmt: skip
    samples = f"{lat['kernel']['n']} and {lat['userspace']['n']}"
    left = s["links_left"]
    return out + [
        "This machine's kernel has no WireGuard, so both data planes run in one boot of the",
        f"kernel guest (Debian's kernel {guest['kernel']} under QEMU/{guest['accel'].upper()},",
        f"{guest['cpus']} vCPUs; `vnetd/lab/guest.py`), in its own netns lab, alternating,",
        "the side that goes first alternating by round. TCG runs Python about 20 times",
        "slower than the host, so the guest's times are not the host's: read the ratio",
        "(kernel / wireguard-go; below 1, the kernel is faster).",
        "",
        *table(["figure (in the guest)", "kernel", "wireguard-go", "kernel / wireguard-go"],
               rows),  # fmt: skip
        "One change: rank 0 of a 1024-rank mesh (as in the data plane section), its",
        f"{change['peers']} peers registered before it started, {p['changes']} endpoint moves",
        f"timed per device per round ({p['rounds']} round(s)), by the daemon's `plan applied`",
        "line; median (min–max). A pass that reads the whole device (a full pass, every",
        "30 s; a pass over a peer still waiting for its initiator, in the 2 s after the",
        "claim that TCG stretches) costs a dump, not a move: the result keeps rank 0's",
        "pass lines after the moves (`details`; a full pass logs its read at DEBUG).",
        "Per round, kernel / wireguard-go of the medians: "
        f"{mmm(change['round_ratios'], 2)}. Join propagation: {p['joins']} joins per mesh of",
        f"{join['ranks']} ranks on one data plane (as the propagation section's steady joins:",
        "a daemon's `peer joined` line minus etcd's acknowledgement of the join), "
        f"{samples} samples.",
        "",
        f"Guest boot {guest['boot_s']:g} s, whole run {guest['wall_s']:g} s. "
        + (f"**{left} kernel link(s) outlived their daemon's SIGTERM** (removed before the "
           "next start). " if left else "")
        + f"Host load: {load_note(r)}, load average up to "
        f"{num(r['load'].get('loadavg_max'))} (the guest's two vCPUs are host threads).",
        "",
        *failures_note(_one_line_errors(r)),
        *(["A failed run is a daemon in the guest that missed a bound (its most frequent",
           "warning, where recorded, is in the error): the guest's two vCPUs are threads on",
           "the host's cores, so a busy host stretches every time in the guest, and the",
           "daemons' fixed 2 s bounds (the etcd watch's liveness read, a keepalive) and",
           "netlink bounds are then missed. Such figures need a quiet host.", ""]
          if r.get("failures") else []),
    ]  # fmt: skip


def _one_line_errors(r: JSON) -> JSON:
    """The result with each failure's error on one line (a helper's traceback, shortened)."""
    failures = [{**f, "error": " ".join(str(f["error"]).split())[:300]} for f in r["failures"]]
    return {**r, "failures": failures}


def kernel_footprint_section(r: JSON | None) -> list[str]:
    """``bench/kernel_footprint.py``: one daemon at N-1 peers on each plane, in the guest."""
    out = ["### One daemon at the largest mesh, kernel WireGuard (kernel guest)", ""]
    if r is None:
        return out + ["Not measured (run `bench/kernel_footprint.py`).", ""]
    p, by = r["params"], r["summary"]["by_dataplane"]
    planes = [d for d in ("kernel", "userspace") if d in by]
    names = {"kernel": "kernel", "userspace": "wireguard-go"}

    def row(label: str, key: str, digits: int = 1) -> list[str]:
        return [label, *(num(by[d].get(key), digits) for d in planes)]

    rows = [
        row("vnetd resident, MiB", "vnetd_rss_mib"),
        row("vnetd PSS, MiB", "vnetd_pss_mib"),
        row("wireguard-go resident, MiB", "wg_rss_mib"),
        row("kernel slab taken since the start, MiB", "kernel_slab_mib"),
        row("kernel per-CPU memory taken, MiB", "kernel_percpu_mib"),
        row("MemAvailable drop since the start, MiB", "mem_available_drop_mib"),
        row("start → every peer on the device, s (guest)", "to_all_peers_s"),
        row("vnetd's CPU by then, s (guest)", "cpu_to_all_peers_s"),
        row("wireguard-go's CPU by then, s (guest)", "wg_cpu_to_all_peers_s"),
        row("its first pass, ms (guest)", "first_pass_ms", 0),
        [f"idle CPU over {num(p['idle_s'], 0)} s, share of a core",
         *(f"{by[d]['idle_share']:.2%}" for d in planes)],
        row("peers on the device (`wg show`)", "device_peers", 0),
        row("routes through the device (`ip route`)", "device_routes", 0),
    ]  # fmt: skip
    guest = p["guest"]
    return out + [
        f"Rank 0 of a {p['size']:,}-rank mesh with its {p['peers']:,} peers registered before",
        "it started (`bench/kernel_footprint.py`), on each data plane in turn in one boot",
        f"of the kernel guest ({guest['kernel']}, QEMU/{guest['accel'].upper()}): the",
        "footprint section's last step, with the kernel's memory as well. Memory is",
        "the same in the guest as on a host; times and CPU seconds are the guest's (TCG",
        "runs Python about 20 times slower): compare the planes, not the host's figures.",
        "The kernel's memory is /proc/meminfo's Slab and Percpu taken between just before",
        "the start and the settled device (the peers, their allowed IPs and their routes,",
        "which the wireguard-go plane has too), for the whole guest: etcd and the lab are",
        "idle meanwhile. On the kernel plane the kernel's work of adding the peers is in",
        "vnetd's netlink calls, so in its CPU; processes' CPU, kernel / wireguard-go (vnetd",
        f"and its wireguard-go): {num(r['summary'].get('cpu_to_all_ratio'), 2)}.",
        "",
        *table(["figure", *(names[d] for d in planes)], rows),
        f"Registering the {p['peers']:,} members took {num(p['seed_s'])} s in the guest. "
        f"Guest boot {guest['boot_s']:g} s, whole run {guest['wall_s']:g} s, ended "
        f"{r['date']} at commit `{r['machine']['commit']}`. Host load: {load_note(r)}.",
        "",
        *failures_note(_one_line_errors(r)),
    ]
