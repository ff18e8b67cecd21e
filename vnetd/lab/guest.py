"""Run a command inside a QEMU guest booted with Debian's kernel (which has WireGuard).

This machine's kernel has no WireGuard module, so the kernel data plane runs
in a guest: ``run_in_guest`` boots the kernel ``scripts/setup`` unpacked
(``guest_image``), with the host's ``/`` shared read-only over virtio-9p under
a tmpfs overlay, loads WireGuard and the lab's modules, runs one command in
the host's tree (the repo and its ``.venv`` at their host paths), powers the
guest off and returns the command's exit code and output.

Host and guest talk only through two 9p shares (the host's root, read-only,
and a temp dir for the command, its output and any result files) and the
serial console (a log file). The root share crosses the host's mount points
(``multidevs=remap`` keeps inode numbers of different host filesystems apart;
without it the guest's ``/sys`` mount landed on ``/proc``); the guest mounts
its own ``/proc``, ``/sys``, ``/dev``, ``/tmp`` and ``/run`` over them. The
guest has no network device (``-nic none``): its traffic stays in its own
loopback and the netns lab it builds. Every step is bounded: the boot (until
the second stage writes ``booted``), the run, and the power-off; on any failure
or timeout, or when the caller stops it (``GuestControl.stop``: a test session
that ends while its guest still runs in a background thread), the QEMU process is
killed by its pid, and the temp dir is removed. ``GuestControl`` also sets the
niceness of QEMU's threads once the guest has booted (the boot keeps its bound at
full priority), and changes it while the guest runs: a guest beside other work
takes mostly the CPU that work leaves, then full priority once it is all that is
left to wait for.

Accelerator: TCG (``-accel tcg -cpu max``), about 20 times slower than the host
for Python. ``/dev/kvm`` opens on this kind of machine, but a KVM guest failed
there (``-cpu host``: QEMU aborted setting MSR 0x10a; other CPU models hung
before the kernel printed anything), so KVM is used only when
``VNETD_GUEST_ACCEL=kvm`` asks for it.

Run by hand with ``scripts/guest [--timeout S] COMMAND...``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vnetd.lab.guest_image import (
    GUEST_CACHE,
    ROOT_TAG,
    SHARE_TAG,
    GuestKernel,
    GuestUnavailable,
    find_kernel,
    initramfs,
)

QEMU = "qemu-system-x86_64"
BOOT_TIMEOUT = 120.0
"""Bound on kernel, initramfs and module loading (about 15 s under TCG here)."""
POWEROFF_TIMEOUT = 30.0
POLL = 0.2
GUEST_MEMORY_MB = 2048
GUEST_CPUS = 2
GUEST_MODULES = ("wireguard", "tun", "veth", "bridge", "nf_tables")
"""Loaded before the command; others (nft expressions, ipv6 bits) load on demand."""
PASSED_ENV = ("CI", "TERM")

STAGE2 = """#!/bin/sh
# The guest's second stage: the host's tree (overlay root), the guest's own kernel.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
share={share}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
version=$(uname -r)
mkdir -p /lib/modules && ln -sfn {modules} "/lib/modules/$version"
for module in {guest_modules}; do
  modprobe "$module" || echo "vnetd-guest: modprobe $module failed"
done
mkdir -p /dev/pts /dev/shm /dev/net
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
[ -e /dev/net/tun ] || mknod /dev/net/tun c 10 200
ip link set lo up
hostname vnetd-guest
: > "$share/booted"
sh "$share/command.sh" > "$share/output" 2>&1 < /dev/null
echo $? > "$share/rc.partial" && mv "$share/rc.partial" "$share/rc"
sync
echo o > /proc/sysrq-trigger
sleep 60
"""


class GuestControl:
    """Steers a guest run from another thread: its niceness after the boot, and its end."""

    def __init__(self, nice: int = 0) -> None:
        self.stop = threading.Event()
        """Set: the run ends at its next poll (every ``POLL`` s), QEMU killed."""
        self._nice = nice
        self._pid: int | None = None
        self._lock = threading.Lock()

    def renice(self, nice: int) -> None:
        """QEMU's threads to niceness ``nice`` now if booted, else once it has."""
        with self._lock:
            self._nice = nice
            if self._pid is not None:
                _renice(self._pid, nice)

    def _booted(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            if self._nice != 0:
                _renice(pid, self._nice)

    def _ending(self) -> None:
        """Before QEMU is reaped (after which its pid may be another process's)."""
        with self._lock:
            self._pid = None


@dataclass(frozen=True)
class GuestResult:
    """What a guest run left: the command's exit code and output, the files it wrote
    to its share that the caller asked for, the serial console, and the times."""

    returncode: int
    output: str
    console: str
    boot_seconds: float
    wall_seconds: float
    files: dict[str, bytes] = field(default_factory=dict)


def guest_unavailable(cache: Path = GUEST_CACHE) -> str | None:
    """Why no guest can be booted here (one line naming the fix), or None."""
    if os.geteuid() != 0:
        return "the kernel guest needs root (it shares the host's whole root read-only)"
    if shutil.which(QEMU) is None:
        return f"no {QEMU}: run scripts/setup"
    try:
        initramfs(find_kernel(cache), cache)
    except GuestUnavailable as error:
        return str(error)
    return None


def qemu_argv(
    kernel: GuestKernel, initrd: Path, share: Path, console: Path, keep: Path
) -> list[str]:
    """The QEMU command line: no network device, the two 9p shares, serial to a file;
    ``keep``: the command's directory, carried over the guest's fresh ``/tmp``."""
    accel = os.environ.get("VNETD_GUEST_ACCEL", "tcg")
    cpu = "host" if accel == "kvm" else "max"
    # no_timer_check: a TCG guest starved by a loaded host failed the IO-APIC timer check
    # and panicked at boot ("IO-APIC + timer doesn't work"); the check proves nothing here.
    append = f"console=ttyS0 panic=-1 quiet no_timer_check vnetd_share={share} vnetd_keep={keep}"
    return [
        QEMU, "-accel", accel, "-cpu", cpu,
        "-m", str(GUEST_MEMORY_MB), "-smp", str(GUEST_CPUS),
        "-nodefaults", "-display", "none", "-no-reboot", "-nic", "none",
        "-serial", f"file:{console}",
        "-kernel", str(kernel.image), "-initrd", str(initrd), "-append", append,
        "-fsdev",
        f"local,id={ROOT_TAG},path=/,security_model=passthrough,readonly=on,multidevs=remap",
        "-device", f"virtio-9p-pci,fsdev={ROOT_TAG},mount_tag={ROOT_TAG}",
        "-fsdev", f"local,id={SHARE_TAG},path={share},security_model=passthrough",
        "-device", f"virtio-9p-pci,fsdev={SHARE_TAG},mount_tag={SHARE_TAG}",
    ]  # fmt: skip


def command_script(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str:
    """``command.sh``: the command in ``cwd`` with a clean environment plus ``env``."""
    base = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "VNETD_GUEST": "1",
        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ},
        **env,
    }
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in base.items())
    return f"cd {shlex.quote(str(cwd))} || exit 125\nexec env -i {assignments} {shlex.join(argv)}\n"


def run_in_guest(
    argv: Sequence[str],
    *,
    run_timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    outputs: Sequence[str] = (),
    boot_timeout: float = BOOT_TIMEOUT,
    cache: Path = GUEST_CACHE,
    control: GuestControl | None = None,
) -> GuestResult:
    """Boot a guest, run ``argv`` in it, power it off; its exit code and output.

    The command sees ``VNETD_GUEST=1`` and ``VNETD_GUEST_SHARE`` (a directory the
    host reads back: the files named in ``outputs`` are returned). ``control``
    lets another thread stop the run (QEMU killed) or change its priority.

    Raises:
        GuestUnavailable: no QEMU, kernel or initramfs; the guest did not boot
            within ``boot_timeout`` or the command did not end within ``run_timeout``
            (the message ends with the console's last lines), or it was stopped.
    """
    if shutil.which(QEMU) is None:
        raise GuestUnavailable(f"no {QEMU}: run scripts/setup")
    kernel = find_kernel(cache)
    initrd = initramfs(kernel, cache)
    workdir = Path(tempfile.mkdtemp(prefix="vnetd-guest-"))
    try:
        share = workdir / "share"
        share.mkdir()
        console = workdir / "console.log"
        env = {**(env or {}), "VNETD_GUEST_SHARE": str(share)}
        cwd = (cwd or Path.cwd()).resolve()
        if any(c.isspace() for c in str(cwd)):
            raise GuestUnavailable(f"{cwd}: the guest cannot run a command in a path with spaces")
        (share / "command.sh").write_text(command_script(argv, cwd, env))
        stage2 = STAGE2.format(
            share=shlex.quote(str(share)),
            modules=shlex.quote(str(kernel.modules)),
            guest_modules=" ".join(GUEST_MODULES),
        )
        (share / "stage2.sh").write_text(stage2)
        return _boot_and_wait(
            qemu_argv(kernel, initrd, share, console, cwd), share, console, outputs,
            boot_timeout, run_timeout, control or GuestControl(),
        )  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _boot_and_wait(
    qemu: list[str],
    share: Path,
    console: Path,
    outputs: Sequence[str],
    boot_timeout: float,
    run_timeout: float,
    control: GuestControl,
) -> GuestResult:
    started = time.monotonic()
    process = subprocess.Popen(
        qemu, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        stop = control.stop
        _wait_for(process, share / "booted", started + boot_timeout, console, "boot", stop)
        booted = time.monotonic()
        control._booted(process.pid)
        _wait_for(process, share / "rc", booted + run_timeout, console, "command", stop)
        # The result is in; a guest still up after the power-off bound (or a stop) is
        # ended by the kill below.
        poweroff = time.monotonic() + POWEROFF_TIMEOUT
        while process.poll() is None and time.monotonic() < poweroff and not stop.wait(POLL):
            pass
        files = {n: (share / n).read_bytes() for n in outputs if (share / n).is_file()}
        output = share / "output"
        return GuestResult(
            returncode=int((share / "rc").read_text().strip()),
            output=output.read_text(errors="replace") if output.exists() else "",
            console=_read(console),
            boot_seconds=booted - started,
            wall_seconds=time.monotonic() - started,
            files=files,
        )
    finally:
        control._ending()
        if process.poll() is None:
            process.kill()  # by its pid: this Popen's own child
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def _wait_for(
    process: subprocess.Popen[bytes],
    path: Path,
    deadline: float,
    console: Path,
    what: str,
    stop: threading.Event,
) -> None:
    while not path.exists():
        if stop.is_set():
            raise GuestUnavailable(f"the guest's {what} was stopped by its caller")
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise GuestUnavailable(
                f"the guest exited ({process.returncode}) before its {what} ended: "
                f"{stderr.strip()[-500:]}{_tail(console)}"
            )
        if time.monotonic() > deadline:
            raise GuestUnavailable(f"the guest's {what} timed out{_tail(console)}")
        stop.wait(POLL)


def _renice(pid: int, nice: int) -> None:
    """Every thread of process ``pid`` (QEMU's vCPUs are threads) to niceness ``nice``;
    threads it starts later inherit it."""
    with contextlib.suppress(FileNotFoundError):  # it has just exited
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)  # Linux: per thread


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(console: Path, lines: int = 15) -> str:
    text = _read(console).strip().splitlines()[-lines:]
    return ("; console:\n" + "\n".join(text)) if text else ""


def main(args: Sequence[str] | None = None) -> int:
    """``scripts/guest``: run a command in the guest, print its output, exit with its code."""
    parser = argparse.ArgumentParser(prog="scripts/guest", description=main.__doc__)
    parser.add_argument("--timeout", type=float, default=600.0, help="run timeout, seconds")
    parser.add_argument("--console", action="store_true", help="print the serial console too")
    parser.add_argument("command", nargs="+")
    parsed = parser.parse_args(args)
    try:
        result = run_in_guest(parsed.command, run_timeout=parsed.timeout)
    except GuestUnavailable as error:
        print(f"scripts/guest: {error}", file=sys.stderr)
        return 2
    if parsed.console:
        sys.stderr.write(result.console)
    sys.stdout.write(result.output)
    print(
        f"guest: boot {result.boot_seconds:.1f} s, wall {result.wall_seconds:.1f} s, "
        f"exit {result.returncode}",
        file=sys.stderr,
    )
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
