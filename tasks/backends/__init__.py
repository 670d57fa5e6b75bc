"""Backends: where the jobs run. Each is a package (`local`, `gke`, `slurm`) laid out like an
Airflow provider package around its driver (`tasks.backend_api.protocol.JobDriver`), registered
with `tasks.backend_api.protocol.register`; `registry` imports them all."""
