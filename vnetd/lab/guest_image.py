"""What the kernel guest boots: Debian's kernel from the setup's cache and a busybox initramfs.

``scripts/setup`` fetches the kernel package by name (``apt-get download`` of
``linux-image-amd64``'s dependency) and unpacks it with ``dpkg -x`` into
``GUEST_CACHE/<package>``, with ``GUEST_CACHE/kernel`` pointing at it. The
initramfs is built here, once per kernel and init script (cached beside the
kernel): the static busybox, the modules that reach the host's root (virtio,
9p, overlayfs, in ``modules.dep`` order) and ``INIT``, the guest's first stage.

The first stage is busybox ``sh``: it mounts the host's ``/`` read-only over
virtio-9p under an overlayfs whose upper layer is a tmpfs, so the guest has a
writable root that vanishes with it (``ip netns exec`` bind-mounts
``/etc/netns/NAME``, pytest and Python write caches, the lab writes its
markers) while the host's tree is never written. Fresh tmpfs go on ``/tmp``
and ``/run`` (the host's namespaces and lab markers must not show through), except
that the command's directory (``vnetd_keep``), when it is under ``/tmp`` (a
checkout there, as a CI clone may be), is carried over them from the overlay; the
results share is mounted at the same path it has on the host, and the second
stage (``guest.py``'s ``STAGE2``, a script in that share, which mounts its own
``/proc``, ``/sys`` and ``/dev``) runs chrooted with ``switch_root``. The archive
is written by the ``cpio`` tool, not by hand.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vnetd.errors import VnetdError

GUEST_CACHE = Path(os.environ.get("VNETD_GUEST_CACHE", "/var/cache/vnetd-guest"))
BUSYBOX = Path("/bin/busybox")
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
ROOT_TAG = "hostroot"
SHARE_TAG = "results"

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "vnetd-guest: $*"; echo o > /proc/sysrq-trigger; sleep 60; }
for module in $(cat /modules.order); do
  insmod "/modules/$module" || fail "insmod $module"
done
share=$(sed -n 's/.*vnetd_share=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
mkdir -p /lower /layers /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro {root} /lower \\
  || fail "mounting the host's root"
mount -t tmpfs -o size=1g tmpfs /layers
mkdir -p /layers/upper /layers/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/layers/upper,workdir=/layers/work /newroot \\
  || fail "mounting the overlay root"
keep=$(sed -n 's/.*vnetd_keep=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
case "$keep" in
  /tmp/*) mkdir -p /keep && mount -o bind "/newroot$keep" /keep || fail "keeping $keep" ;;
  *) keep= ;;
esac
for dir in tmp run; do mount -t tmpfs -o mode=1777 tmpfs "/newroot/$dir"; done
if [ -n "$keep" ]; then
  mkdir -p "/newroot$keep" && mount -o move /keep "/newroot$keep" || fail "moving $keep"
fi
mkdir -p "/newroot$share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 {share} "/newroot$share" \\
  || fail "mounting the results share"
umount /proc /sys /dev
exec switch_root /newroot /bin/sh "$share/stage2.sh"
""".replace("{root}", ROOT_TAG).replace("{share}", SHARE_TAG)


class GuestUnavailable(VnetdError):
    """The kernel guest cannot be built or booted on this machine (what to run is named)."""


@dataclass(frozen=True)
class GuestKernel:
    """An unpacked kernel package: its image and the tree ``modprobe -d`` reads."""

    root: Path
    version: str

    @property
    def image(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version


def find_kernel(cache: Path = GUEST_CACHE) -> GuestKernel:
    """The kernel ``scripts/setup`` unpacked.

    Raises:
        GuestUnavailable: none there (or unpacked only in part).
    """
    root = cache / "kernel"
    if not (root / ".vnetd-unpacked").exists():
        raise GuestUnavailable(f"no guest kernel in {cache}: run scripts/setup (as root)")
    versions = sorted(p.name for p in (root / "lib" / "modules").iterdir() if p.is_dir())
    if len(versions) != 1:
        raise GuestUnavailable(f"{root}/lib/modules holds {versions}: run scripts/setup again")
    kernel = GuestKernel(root.resolve(), versions[0])
    if not kernel.image.exists() or not (kernel.modules / "modules.dep").exists():
        raise GuestUnavailable(f"{root} lacks its image or modules.dep: run scripts/setup again")
    return kernel


def module_order(kernel: GuestKernel, wanted: tuple[str, ...] = BOOT_MODULES) -> list[str]:
    """The module files (relative to the modules dir) to insmod for ``wanted``,
    dependencies first, each once (from ``modules.dep``)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[Path(path).name.split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in reversed(deps[path]):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name not in by_name:
            raise GuestUnavailable(f"the guest kernel {kernel.version} has no module {name}")
        visit(by_name[name])
    return order


def initramfs(kernel: GuestKernel, cache: Path = GUEST_CACHE) -> Path:
    """The initramfs for ``kernel`` (built on first use, then reused).

    Raises:
        GuestUnavailable: no static busybox or cpio (run scripts/setup).
    """
    if not BUSYBOX.exists() or shutil.which("cpio") is None:
        raise GuestUnavailable("the guest needs busybox-static and cpio: run scripts/setup")
    order = module_order(kernel)
    digest = hashlib.sha256("\n".join([INIT, kernel.version, *order]).encode()).hexdigest()
    target = cache / f"initramfs-{kernel.version}-{digest[:12]}.cpio"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="vnetd-initramfs-") as tmp:
        tree = Path(tmp) / "tree"
        for sub in ("bin", "modules", "proc", "sys", "dev"):
            (tree / sub).mkdir(parents=True)
        shutil.copy2(BUSYBOX, tree / "bin" / "busybox")
        for path in order:
            shutil.copy2(kernel.modules / path, tree / "modules" / Path(path).name)
        (tree / "modules.order").write_text("".join(Path(p).name + "\n" for p in order))
        (tree / "init").write_text(INIT)
        (tree / "init").chmod(0o755)
        names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        partial = target.with_suffix(f".tmp{os.getpid()}")
        with partial.open("wb") as out:
            subprocess.run(
                ["cpio", "--quiet", "-o", "-H", "newc"],
                input="\n".join(names).encode(), stdout=out, cwd=tree, check=True, timeout=60,
            )  # fmt: skip
        os.replace(partial, target)
    return target
