"""The data-plane port: a WireGuard device vnetd adds and removes peers on, grouped by
what each part talks to (docs/architecture.md, "Module map").

``base`` is the port (the ``Dataplane`` protocol, ``DeviceConfig``; pure) and
``select`` chooses and opens a backend; ``fake`` is the in-memory backend and
``device_reader`` reads this host's device for ``status`` and ``wait``. The rooms:
``codec`` (pure wire formats: wireguard-go's UAPI text, netlink and rtnetlink),
``wireguard_go`` (the userspace device over UAPI), ``kernel`` (the in-kernel device
over WireGuard's generic netlink), and ``rtnetlink`` (the link, its addresses and
routes, for both). This ``__init__`` imports nothing: import from the module that
defines a name.
"""
