"""``vnetd doctor``'s plan: the settings of one run, checked.

Pure (no I/O), so the parser (``vnetd.commands.doctor.command``) and the run
(``vnetd.commands.doctor.gather``) both import it and neither imports the other
at load (docs/architecture.md, "Module map").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vnetd.errors import SpecError
from vnetd.spec import MeshSpec

DEFAULT_TIMEOUT = 30.0
MIN_TIMEOUT = 5.0
MAX_TIMEOUT = 3600.0


@dataclass(frozen=True)
class DoctorPlan:
    """``vnetd doctor``'s settings, checked.

    Raises:
        SpecError: ``--timeout`` out of range, or the spec turns the probe
            service off (the CLI exits 2).
    """

    spec: MeshSpec
    json: bool = False
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and MIN_TIMEOUT <= self.timeout <= MAX_TIMEOUT):
            raise SpecError(
                f"--timeout: {self.timeout:g} is out of range; give {MIN_TIMEOUT:g} to "
                f"{MAX_TIMEOUT:g} seconds"
            )
        if not self.spec.doctor_port:
            raise SpecError(
                "mesh.doctor_port: 0 turns the daemons' probe service off, so there is "
                "nothing to ask; set it (default 51821) and restart the daemons"
            )
