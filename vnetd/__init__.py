"""vnetd: a rank-addressed WireGuard overlay that forms in any start order.

Where things are, from the bottom up (docs/architecture.md, "Module map"):
``spec``, ``model`` and ``errors`` are the records; ``mesh/`` decides each
rank's peers; ``render/``, ``status/``, ``wait/`` and ``doctor/`` are what the
consumers are shown (pure). ``keys`` and ``logs`` are leaves over one library
each; ``config`` resolves a command's flags, environment and spec, ``identity``
who a member is (rank, endpoint, instance, site), ``daemon_settings`` all of
``vnetd up``'s inputs into the one record the daemon runs with. ``registry/``
and ``dataplane/`` are the ports with their backends; ``control/`` is the
control plane (claim, watch, retry); ``observe/`` the HTTP endpoints and
metrics; ``daemon/`` the runtime that runs them all, with the probe service
``vnetd doctor`` asks; ``commands/`` (a package per command with parts) and
``cli`` the command line; ``lab/`` the netns lab of the tests and the demo.

A folder is one layer. The modules loose at this level are the exception: the
small layers' own (the records, the leaves, the settings) and the command
line's entry points (``cli``, ``__main__``), each named with its layer in the
map.
"""

__version__ = "0.1.0"
