"""Backends: where the jobs run. The protocol and the registry are in `tasks.backends.base`;
each backend is a module (`local`) or a package (`gke`) of its own."""
