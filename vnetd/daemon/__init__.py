"""The daemon runtime: ``root`` (start-up, signals, shutdown), ``control_plane`` (spec
check, watch, reconciler, claim once the device is up), ``reconciler`` (the one task
that changes the device) and ``running`` (what a started daemon exposes).

Nothing is imported here: ``vnetd up`` imports ``root`` before the rank's address
is up and ``control_plane`` after it (docs/architecture.md, "Start-up").
"""
