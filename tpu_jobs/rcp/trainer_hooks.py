"""What a training loop calls on its RCP hooks (`TrainerHooks`), whichever process it runs on.

`tpu_jobs.rcp.callbacks.RcpHooks` (process 0: records and saves) and
`tpu_jobs.rcp.distributed.FollowerHooks` (the other processes: write nothing) both satisfy it;
the loop and `tpu_jobs.rcp.distributed` call only these methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

PyTree = Any


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the restored state after `step` updates."""

    step: int
    params: PyTree
    state: PyTree
    timestamp_ms: int
    # The log already has its block_stop: training had ended; only on_train_end() may follow.
    finished: bool


class TrainerHooks(Protocol):
    def resume(
        self, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
    ) -> ResumePoint | None:
        """The newest checkpoint of this run restored into trees like these; None: a fresh run."""
        ...

    def on_init_start(self, time_ms: int | None = None) -> None: ...

    def on_run_start(self, time_ms: int | None = None) -> None: ...

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        """Right after optimizer update `step`; returns its timestamp_ms."""
        ...

    @property
    def save_wait_s(self) -> float:
        """`after_update`'s time waiting for the saver (saves outlasting steps), in all."""
        ...

    def stop_requested(self) -> bool:
        """After a step: this process's view of the stop request (see `distributed`)."""
        ...

    def on_train_end(self) -> None: ...

    def __enter__(self) -> TrainerHooks: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
