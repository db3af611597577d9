"""A real two-node Slurm on this machine, for tests and demos (root, Debian)."""
