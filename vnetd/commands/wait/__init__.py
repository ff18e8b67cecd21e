"""``vnetd wait``: ``command`` (the parser, its settings and plan) and ``run`` (the wait
loop); the gate it evaluates is ``vnetd.wait``."""
