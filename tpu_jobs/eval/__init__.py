"""The evaluator both trainers' evaluators share: the target and its checks (`target`), the
attempts (`attempts`), shards (`shards`), one checkpoint's evaluation (`orchestration`) and the
command line (`cli`). A trainer provides a `target.CheckpointLoader`."""
