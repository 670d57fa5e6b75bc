"""Jobs, the same on every backend: `command` (argv templates per role), `templates` (the
deployment's ``[jobs]`` table), `values` (what the placeholders stand for), `result` (taking a
foreign evaluate job's result into the run), `processes` (our own processes: stopping them,
free ports). Airflow-free; backends run what these describe."""
