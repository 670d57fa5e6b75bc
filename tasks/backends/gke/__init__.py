"""The GKE backend, laid out like an Airflow provider package: `settings` (the ``[gke]`` table),
`render` (JobSet objects), `status` (reading a JobSet's status), `triggers`, `operators`,
`groups` (task-group builders) and `backend` (the `GkeBackend` object)."""
