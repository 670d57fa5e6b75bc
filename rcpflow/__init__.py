"""rcpflow: the contract of an MLPerf Training RL (`qwen35_397b_grpo`) run, in pure Python.

Sub-packages by role, lowest first (`tests/test_layering.py` holds the levels): `files` (layout,
storage, strict JSON), `records` (manifest, MLLOG, summaries), `verdict` (verify, gate,
finalize, importers), `submission` (checkers, packaging), `planning` (forecast, rehearsal
profile), `trainer` (recorder, lease, job exit codes), `cli` (the `rcpflow` command). The recipe
(`rcpflow.recipe`) is below them all. Nothing here imports Airflow or JAX. A run folder's life,
stage by stage: docs/run-folder.md.
"""
