"""Consumer configs rendered from the spec alone: Flux, hosts, MPI host files, wg-quick."""
