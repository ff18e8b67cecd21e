"""The userspace data plane: wireguard-go, supervised (``supervise``), configured over
its UAPI socket (``uapi_client``), put together as a device (``device``). See
docs/architecture.md, "Data plane and routing"."""
