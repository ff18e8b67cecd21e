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
