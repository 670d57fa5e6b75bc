"""From records to a verdict: whether a checkpoint's evaluation stands (`verify`), the short-circuit
decision (`gate`), when a planned step may be evaluated (`readiness`), importing a foreign
evaluator's result (`eval_import`), finalize (the single writer of the eval section) and the stop
request a decided run writes for its trainer.
"""
