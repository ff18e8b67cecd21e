"""The daemon seen from outside: HTTP health, readiness, metrics and status."""
