"""What a backend is and what every backend shares, below `tasks.run`: the `Backend` protocol and
its registry (`protocol`); the cluster backends (`tasks.backends.gke`, `tasks.backends.slurm`)
build on the rest of this package instead of copying each other."""
