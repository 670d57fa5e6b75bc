"""rcpflow: the contract of an MLPerf Training RL (`qwen35_397b_grpo`) run, in pure Python.

Recipe math, the run folder layout, storage (local and ``gs://``), the checkpoint manifest, the
MLPerf log (MLLOG), pass@k and eval summaries, finalize, and the official checkers. Nothing here
imports Airflow or JAX: the trainer, the evaluator and the DAGs all depend on this package, never
the other way round.
"""
