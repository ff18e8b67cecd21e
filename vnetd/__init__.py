"""vnetd: a rank-addressed WireGuard overlay that forms in any start order."""

__version__ = "0.1.0"
