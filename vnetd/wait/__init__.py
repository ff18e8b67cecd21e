"""``vnetd wait``'s gate (``gate``), what a launcher runs before a job that needs N ranks;
the command is ``vnetd.commands.wait``."""
