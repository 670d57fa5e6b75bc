"""The GKE backend, laid out like an Airflow provider package: `settings` (the ``[gke]`` table
and the cluster), `render` (JobSet objects), `crd` (the cluster's JobSet CRD checked against a
rendered JobSet), `status` (reading a JobSet's status), `hooks` (every call to the cluster's
API), `adapter` (the lifecycle's calls to it), `triggers`, `operators` (run and delete a
JobSet), `evaluate_operators` (a checkpoint's evaluation as a JobSet) and `backend` (the run's
nodes)."""
