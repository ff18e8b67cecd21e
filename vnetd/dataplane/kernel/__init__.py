"""The kernel data plane: an in-kernel WireGuard link (``device``), configured over
WireGuard's generic netlink family (``wg_netlink``). See docs/architecture.md,
"Kernel data plane and the choice"."""
