"""What a trainer calls and what guards its run folder: the recorder
(`rcpflow.trainer.recorder.TrainingRecorder`, re-exported as `rcpflow.recorder`), the run folder's
lease, `rcpflow run reset`, `rcpflow manifest add`, and the exit-code contract of every job
(`job_exit`).
"""
