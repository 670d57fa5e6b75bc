"""Developer tools, not the product: the demo and `make ui`, the local servers (Airflow,
PostgreSQL, Slurm, sshd, a Kubernetes control plane), the benches and synthetic run folders.

The top floor: it imports the product (tasks, tpu_jobs, rcpflow), nothing in the product imports
it, the installed package and the images leave it out. Run it from the repository root
(``python -m devtools.demo``).
"""
