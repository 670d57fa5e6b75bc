"""The Slurm backend: jobs as Slurm batch jobs (sbatch) through the worker's own commands, a login
node over SSH, or slurmrestd (docs/slurm.md): `settings` (the ``[slurm]`` table), `script` (the
batch script), `in_allocation` (evaluation in the training's allocation), `hooks`, `job_info`
and `rest_api` (every call to the cluster), `adapter` (the driver's cluster calls), `outcome`
(the exit-code contract) and `driver`."""
