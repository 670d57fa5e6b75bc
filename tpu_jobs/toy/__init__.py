"""The toy trainer: the policy (`model`), GRPO (`grpo`), the job (`train`, ``python -m
tpu_jobs.train``) and its checkpoints' evaluator (`evaluate`, ``python -m tpu_jobs.evaluate``)."""
