"""``vnetd status``'s plan: the resolved spec and the command's flags, checked.

Pure (no I/O), so the parser (``vnetd.commands.status.command``) and the views
(``vnetd.commands.status.show``) both import it and neither imports the other at
load (docs/architecture.md, "Module map").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from vnetd.config import DEFAULT_WIREGUARD_DIR
from vnetd.dataplane.codec.uapi_protocol import socket_path
from vnetd.errors import SpecError
from vnetd.spec import MeshSpec

DEFAULT_INTERVAL = 2.0
MIN_INTERVAL = 0.2
MAX_INTERVAL = 3600.0


@dataclass(frozen=True)
class StatusPlan:
    """``vnetd status``'s settings: the resolved spec and the command's flags, checked.

    Raises:
        SpecError: ``--interval`` is out of range (the CLI exits 2).
    """

    spec: MeshSpec
    json: bool = False
    watch: bool = False
    interval: float = DEFAULT_INTERVAL
    wireguard_dir: Path = DEFAULT_WIREGUARD_DIR

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and MIN_INTERVAL <= self.interval <= MAX_INTERVAL):
            raise SpecError(
                f"--interval: {self.interval:g} is out of range; give {MIN_INTERVAL:g} to "
                f"{MAX_INTERVAL:g} seconds"
            )

    @property
    def device_socket(self) -> Path:
        """wireguard-go's UAPI socket, read when it is there."""
        return Path(socket_path(self.spec.interface, self.wireguard_dir))
