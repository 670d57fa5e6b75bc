"""The digit task trained by google-tunix's own GRPO trainer, as a submitter would run it.

`vocab` (the in-memory tokenizer), `policy` (a small Tunix Qwen3 and the mesh), `checkpoints`
(Tunix's checkpoint layout: options, commit watch, restore), `recording` (the RCP recording wired
into Tunix's loop), `train` (``python -m tpu_jobs.tunix_train``), `evaluate`
(``python -m tpu_jobs.tunix_evaluate``). Importing anything here needs the ``tunix`` extra.
"""
