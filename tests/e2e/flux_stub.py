#!/usr/bin/python3
"""A stand-in for ``flux`` in the lab: checks what ``flux broker`` would read, then exits.

Flux is not installed here. The Flux container's start-up script ends in
``exec flux broker --config-path=DIR ...``; this stub checks the inputs a
broker needs at that moment, as flux-core reads them, and says so:

* the config directory holds a ``[bootstrap]`` table whose ``hosts`` list
  this host name (its rank);
* ``curve_cert`` is a file this user can read, mode 0400 and owned by this
  (non-root) user: flux-core refuses one that its group or others can read;
* this rank's ``bind`` address is on an interface (the overlay is up).

Exit 0 with ``flux stub: broker rank R ...``, else 1 naming the problem.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import tomllib


def fail(message: str) -> None:
    print(f"flux stub: {message}", file=sys.stderr)
    sys.exit(1)


def main(argv: list[str]) -> None:
    if argv[:1] != ["broker"]:
        fail(f"expected 'flux broker ...', got {argv}")
    config = [a.split("=", 1)[1] for a in argv if a.startswith("--config-path=")]
    if len(config) != 1 or not os.path.isdir(config[0]):
        fail(f"--config-path names no directory: {config}")
    bootstrap = {}
    for path in sorted(glob.glob(os.path.join(config[0], "*.toml"))):
        with open(path, "rb") as handle:
            bootstrap.update(tomllib.load(handle).get("bootstrap", {}))
    hosts = [h["host"] for h in bootstrap.get("hosts", [])]
    host = socket.gethostname()
    if host not in hosts:
        fail(f"host name {host!r} is not in the bootstrap hosts {hosts}")
    rank = hosts.index(host)
    cert = bootstrap.get("curve_cert", "")
    try:
        stat = os.stat(cert)
        with open(cert, "rb"):
            pass
    except OSError as exc:
        fail(f"curve_cert {cert}: {exc.strerror}")
    mode, uid = stat.st_mode & 0o777, os.getuid()
    if uid == 0:
        fail("runs as root; the Flux image's user is not")
    if mode & 0o077:
        fail(f"curve_cert {cert}: readable by group/other (mode {mode:04o})")
    if stat.st_uid != uid:
        fail(f"curve_cert {cert}: owned by uid {stat.st_uid}, not by this user ({uid})")
    bind = bootstrap["hosts"][rank]["bind"]
    address = bind.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    held = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    if f" {address}/" not in held:
        fail(f"bind address {address} is on no interface")
    print(
        f"flux stub: broker rank {rank} of {len(hosts)} would start: bind {bind}, "
        f"curve_cert {cert} (mode {mode:04o}, uid {uid}), initial program {argv[1:]}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
