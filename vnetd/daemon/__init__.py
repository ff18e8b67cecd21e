"""The daemon runtime: ``root`` (start-up, signals, shutdown), ``control_plane`` (spec
check, watch, reconciler, claim once the device is up), ``reconciler`` (the one task
that changes the device), ``plan_log`` (its lines per plan), ``running`` (what a
started daemon exposes) and the probe service ``vnetd doctor`` asks
(``probe_service``, with ``probe_echo``, its probe of one peer).

Nothing is imported here: ``vnetd up`` imports ``root`` before the rank's address
is up and ``control_plane`` after it (docs/architecture.md, "Start-up").
"""
