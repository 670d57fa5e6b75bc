"""The records of a run and their checks: the manifest of checkpoints, the MLLOG and its training
section, evaluation summaries and per-attempt records, pass@k, a run's identity, where training
stands for a planned checkpoint, the `run_stop` a log holds, the official RCP reference points.
Built on `rcpflow.files`.
"""
