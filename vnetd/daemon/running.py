"""``Running``: what a started daemon exposes to tests and to its HTTP endpoints.

``control_plane`` builds it; ``observe.endpoints`` reads it as its
``RunningDaemon`` protocol, so observe imports nothing of the daemon runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from vnetd.control.claim import ClaimHolder
from vnetd.control.retry import RegistryHealth
from vnetd.control.watcher import MemberView
from vnetd.daemon.reconciler import Reconciler
from vnetd.dataplane.base import Dataplane
from vnetd.model import Member
from vnetd.spec import MeshSpec


@dataclass
class Running:
    """What a started daemon exposes (to tests, status and health endpoints)."""

    spec: MeshSpec
    me: Member
    view: MemberView
    claim: ClaimHolder
    reconciler: Reconciler
    dataplane: Dataplane
    health: RegistryHealth
