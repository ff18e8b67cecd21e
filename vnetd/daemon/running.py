"""``Running``: what a started daemon exposes to tests and to its HTTP endpoints.

A module of its own so that ``daemon`` (which builds it) and
``observe.endpoints`` (which reads it) need not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from vnetd.control.claim import ClaimHolder
from vnetd.control.watcher import MemberView
from vnetd.dataplane import Dataplane
from vnetd.model import Member
from vnetd.reconciler import Reconciler
from vnetd.retry import RegistryHealth
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
