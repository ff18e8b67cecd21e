"""The etcd backend of the registry port (docs/architecture.md, "Module map").

``client.EtcdRegistry`` speaks etcd's v3 JSON gateway (``gateway``, the codec;
``tokens``, ``security``, ``watch``, ``httpcore_package``: the rest of that transport).
What does not depend on the transport talks to the small interface of
``transport`` and imports neither the gateway nor httpx, so a second transport
(native gRPC, say) can reuse it: paged lists (``pages``), roles and users
(``auth``), the choice among endpoints (``endpoints``).
"""
