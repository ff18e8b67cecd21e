"""Consumer configs rendered from the spec alone: Flux, hosts, MPI host files, wg-quick,
manifests; the commands that print them are ``vnetd.commands.render``."""
