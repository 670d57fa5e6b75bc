"""Backends: where the jobs run. Each is a module (`local`) or a package (`gke`, `slurm`) laid out
like an Airflow provider package, registered with `tasks.backend_api.protocol.register`;
`registry` imports them all."""
