"""The GKE backend, laid out like an Airflow provider package: `settings` (the ``[gke]`` table
and the cluster), `render` (JobSet objects), `crd` (the cluster's JobSet CRD checked against a
rendered JobSet), `status` (reading a JobSet's status), `hooks` (every call to the cluster's
API), `adapter` (the driver's calls on the worker) and `driver`."""
