"""The RCP recording library any trainer calls: `hooks` (RcpHooks), the checkpoint format,
writer and restore, `fingerprint`, `distributed`, `termination`, the shared job CLI
(`job_cli`, `job_errors`) and `optimizer`. It imports no trainer and no evaluator."""
