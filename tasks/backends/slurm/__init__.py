"""The Slurm backend: jobs as Slurm batch jobs (sbatch) through the worker's own commands, a login
node over SSH, or slurmrestd (docs/slurm.md)."""
