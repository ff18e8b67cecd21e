"""``vnetd doctor``: every ordered pair of the mesh probed, and one cause for each that fails."""
