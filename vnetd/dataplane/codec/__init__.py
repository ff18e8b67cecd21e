"""The data plane's wire formats, pure (no socket, no I/O library): wireguard-go's
UAPI text (``uapi_protocol``), netlink's header, attributes and message walker
(``netlink_wire``), and rtnetlink's link, address and route requests
(``rtnetlink_wire``). See docs/architecture.md, "Module map"."""
