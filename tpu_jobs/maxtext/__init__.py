"""The digit task trained and evaluated by MaxText, the seed's model stack (docs/maxtext.md).

`config` (the model size and the MaxText settings a run is made of: recipe -> ``key=value``),
`checkpoints` (MaxText's native scanned checkpoints as this job saves and reads them: the record
in each step's metadata, the commit watch), `layout` (scanned <-> unscanned parameter trees,
bf16 rounding), `model` (MaxText's trainer and model driven from Python: setup, train step,
next-token logits), `train` (``python -m tpu_jobs.maxtext.train``), `evaluate`
(``python -m tpu_jobs.maxtext.evaluate``: MaxText's converter, restore, pass@k). `config`,
`checkpoints` and `layout` need only JAX; the others need MaxText 0.2.5 (Python >= 3.12, its
own environment: devtools/servers/maxtext_env.py, docker/Dockerfile.maxtext).
"""
