"""Backends: where the jobs run. `base` is the protocol and the registry it owns; each backend
is a module (`local`) or a package (`gke`) that registers itself; `registry` imports them all."""
