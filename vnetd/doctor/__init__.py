"""``vnetd doctor``'s pure parts: ``evidence`` (a row and its wire form), ``cause`` (one
cause per failing pair) and ``report``; the command is ``vnetd.commands.doctor``, the
probe service ``vnetd.daemon.probe_service``."""
