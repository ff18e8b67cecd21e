"""``vnetd status``: every rank of the spec, registered or not, with its device counters."""
