"""``vnetd status``: ``command`` (the parser), ``plan`` (its settings) and ``show`` (one
look at the registry and the device, drawn once or live); the view is ``vnetd.status``."""
