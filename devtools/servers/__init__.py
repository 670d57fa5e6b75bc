"""Private servers on 127.0.0.1 for the demo and the tests: Airflow, PostgreSQL, Slurm, sshd.
Each is started in a fresh temporary folder and stopped by the PIDs it holds."""
