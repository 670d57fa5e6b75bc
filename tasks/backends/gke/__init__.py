"""The GKE backend, laid out like an Airflow provider package: `settings` (the ``[gke]`` table
and the cluster), `render` (JobSet objects), `status` (reading a JobSet's status), `hooks` (every
call to the cluster's API), `triggers`, `operators` (run and delete a JobSet), `evaluate` (a
checkpoint's evaluation as a JobSet), `groups` (task-group builders) and `backend`."""
