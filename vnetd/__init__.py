"""vnetd: a rank-addressed WireGuard overlay that forms in any start order.

Where things are, from the bottom up (docs/architecture.md, "Module map"):
``spec``, ``model`` and ``errors`` are the records; ``mesh/`` decides each
rank's peers; ``render/``, ``status.view`` and ``wait.gate`` are what the
consumers are shown. ``keys`` and ``logs`` are leaves over one library each;
``config`` resolves flags, environment and spec once, ``identity`` what needs
the host. ``registry/`` and ``dataplane/`` are the ports with their backends;
``control/`` is the control plane (claim, watch, retry); ``observe/`` the HTTP
endpoints and metrics; ``daemon/`` the runtime that runs them all;
``commands/`` and ``cli`` the command line; ``lab/`` the netns lab of the
tests and the demo.
"""

__version__ = "0.1.0"
