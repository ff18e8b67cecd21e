"""The control plane: registry layout, claim and lease, member watch, rank assignment."""
