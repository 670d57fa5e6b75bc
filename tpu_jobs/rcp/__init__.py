"""The RCP recording library any trainer calls: the training callbacks (`callbacks.RcpHooks` on
process 0, `distributed.FollowerHooks` on the others, both the `trainer_hooks.TrainerHooks`
protocol), the checkpoint format, writer, save queue and restore (`checkpoint_format`,
`checkpoint_writer`, `saver`, `checkpoint_restore`), the weights `fingerprint`, several processes
(`distributed`, `sharding`, `collectives`), SIGTERM (`termination`), the shared job CLI
(`job_cli`, `job_errors`) and `optimizer`. It imports no trainer and no evaluator."""
