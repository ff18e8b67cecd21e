"""The relay: one list+watch on etcd for a mesh's members, served to many daemons as the
subset of etcd's JSON gateway they read with (docs/architecture.md, "Relay").

``cache`` keeps the members and a window of recent events (pure); ``upstream`` keeps it
in step with the registry; ``app`` serves it; ``reads`` is the daemon's side, the
members read through relays and every other call straight to etcd."""
