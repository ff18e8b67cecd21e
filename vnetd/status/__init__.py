"""``vnetd status``'s view: every rank of the spec, registered or not, with its device
counters (``view``) and its table (``table``); the command is ``vnetd.commands.status``."""
