"""``vnetd wait``: the gate a launcher runs before a job that needs N ranks."""
