"""``vnetd doctor``: ``command`` (the parser), ``plan`` (its settings) and ``gather`` (the
run: every daemon's row asked for); the causes and the report are ``vnetd.doctor``, the
probe service the daemons run is ``vnetd.daemon.probe_service``."""
