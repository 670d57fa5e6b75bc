"""The documented import path of the trainer recorder for bring-your-own trainers
(`from rcpflow.recorder import TrainingRecorder`); it lives in `rcpflow.trainer.recorder`."""

from rcpflow.trainer.recorder import (
    RecorderError,
    Resumed,
    RunFolderError,
    TrainingRecorder,
    now_ms,
)

__all__ = ["RecorderError", "Resumed", "RunFolderError", "TrainingRecorder", "now_ms"]
