"""What a DAG leaves behind besides the run folder: the checker verdicts it persisted
(`verdicts`) and the asset events it publishes (`assets`)."""
