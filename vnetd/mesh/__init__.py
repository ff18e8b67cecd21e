"""The pure topology: which peers a rank has and what changes on its device.

``peers``: ``desired_peers`` and ``diff``, the one computation the daemon and
``vnetd render wg-quick`` share; ``gateways``: which peer holds the ranks
behind a site gateway; ``initiator``: which side of a pair starts its
handshake (invariant 10). Standard library only (docs/architecture.md,
"Module map").
"""
