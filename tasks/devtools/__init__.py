"""Developer tools (the demo, a private Airflow server); not part of the Airflow image."""
