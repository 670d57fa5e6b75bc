"""The local backend: jobs as process groups of this machine (`driver`, through the process
calls of `processes`). Single-host: the worker that starts a job, the triggerer that watches
it and the teardown that cancels it run on one machine."""
