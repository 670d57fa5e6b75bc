"""Rehearsal jobs: a trainer and an evaluator with every file contract of a real submission
(the recorder's MLLOG and manifest rows, per-step checkpoints, Tunix-format summaries with
DeepSWE attempt records, the stop request) whose running time comes from a job profile and
whose pass@4 per step comes from a curve per seed (`rcpflow.planning.rehearsal`). No JAX: they run
in a CPU image, so a submitter rehearses the scheduler and the backend before spending chips.

    python -m tpu_jobs.rehearsal.train --run-dir D --seed S [...] [--time-scale 0.005]
    python -m tpu_jobs.rehearsal.evaluate --run-dir D --step N [--output-root DIR]

`profile.toml` holds the seed's figures (step 185 s, evaluation 1,700 s, 128 training chips,
64 per evaluation) and `curve.csv` seeds 1..3, first passing at steps 20, 23 and 19.
"""
