"""vnetd: a rank-addressed WireGuard overlay that forms in any start order.

Where things are, from the bottom up (docs/architecture.md, "Module map"):
``spec``, ``model`` and ``errors`` are the records; ``mesh/`` decides each
rank's peers; ``render/``, ``status.view`` and ``wait.gate`` are what the
consumers are shown. ``keys`` and ``logs`` are leaves over one library each;
``config`` resolves a command's flags, environment and spec, ``identity`` who a
member is (rank, endpoint, instance, site), ``daemon_settings`` all of ``vnetd
up``'s inputs into the one record the daemon runs with. ``registry/`` and
``dataplane/`` are the ports with their backends; ``control/`` is the control
plane (claim, watch, retry); ``observe/`` the HTTP endpoints and metrics;
``daemon/`` the runtime that runs them all; ``commands/`` and ``cli`` the
command line; ``lab/`` the netns lab of the tests and the demo.
"""

__version__ = "0.1.0"
