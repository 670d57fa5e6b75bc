"""Accelerator jobs: the toy GRPO trainer, the evaluator, and the RCP hooks any trainer calls."""
