"""One training job over several processes (the hosts of a TPU slice): the layout from the
environment, `jax.distributed` from it, `FollowerHooks` for every process but 0, and the stop
decision all of them share.

RCPFLOW_COORDINATOR_ADDRESS / RCPFLOW_NUM_PROCESSES / RCPFLOW_PROCESS_ID (set by
tasks.backends.gke.render and by `tpu_jobs.launch`) give the layout; without them the job is one
process. Every process saves and restores its own shards of each checkpoint; process 0 alone
writes the MLLOG and the manifest, and what it decides (where to resume, whether to stop) reaches
the others (docs/tpu_jobs.md has the why).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax

from rcpflow.files.layout import RunLayout
from rcpflow.trainer.recorder import now_ms
from tpu_jobs.rcp import collectives
from tpu_jobs.rcp.callbacks import close_after_failure, restore_point, save_update
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.checkpoint_writer import CheckpointSaver
from tpu_jobs.rcp.trainer_hooks import ResumePoint, TrainerHooks

COORDINATOR_ADDRESS_ENV = "RCPFLOW_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "RCPFLOW_NUM_PROCESSES"
PROCESS_ID_ENV = "RCPFLOW_PROCESS_ID"
# How long a process waits for all the others to join (pods of a slice start within minutes).
INIT_TIMEOUT_S = 600

PyTree = Any


class LayoutError(ValueError):
    """The process layout in the environment is inconsistent; the message names the variable."""


@dataclass(frozen=True)
class ProcessLayout:
    """Which process of how many this one is, and where process 0 listens."""

    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None

    @property
    def multi_process(self) -> bool:
        return self.num_processes > 1


def layout_from_env(env: Mapping[str, str] | None = None) -> ProcessLayout:
    """The layout the environment describes: none of the variables set means one process."""
    env = os.environ if env is None else env
    names = (COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)
    given = {name: env[name] for name in names if env.get(name)}
    if not given:
        return ProcessLayout()
    missing = [name for name in names if name not in given]
    if missing:
        raise LayoutError(
            f"{', '.join(missing)} not set (a multi-process job needs all of {names})"
        )
    counts = {}
    for name in (NUM_PROCESSES_ENV, PROCESS_ID_ENV):
        try:
            counts[name] = int(given[name])
        except ValueError:
            raise LayoutError(f"{name}={given[name]!r} is not an integer") from None
    num, pid = counts[NUM_PROCESSES_ENV], counts[PROCESS_ID_ENV]
    if num < 1 or not 0 <= pid < num:
        raise LayoutError(f"{PROCESS_ID_ENV}={pid} with {NUM_PROCESSES_ENV}={num}: out of range")
    host, _, port = given[COORDINATOR_ADDRESS_ENV].rpartition(":")
    if not host or not port.isdigit():
        raise LayoutError(
            f"{COORDINATOR_ADDRESS_ENV}={given[COORDINATOR_ADDRESS_ENV]!r} is not host:port"
        )
    return ProcessLayout(num, pid, given[COORDINATOR_ADDRESS_ENV])


def initialize(layout: ProcessLayout) -> None:
    """Join the `jax.distributed` system of `layout` (nothing for one process). Call before
    any other JAX call; blocks until every process has joined."""
    if layout.multi_process:
        jax.distributed.initialize(
            coordinator_address=layout.coordinator_address,
            num_processes=layout.num_processes,
            process_id=layout.process_id,
            initialization_timeout=INIT_TIMEOUT_S,
        )


@dataclass(frozen=True)
class StopDecision:
    """After a step, the same on every process: stop here, and whether because of SIGTERM."""

    stop: bool
    terminated: bool


def stop_decision(hooks: TrainerHooks, terminated: bool) -> StopDecision:
    """After a step: does the run stop here? Process 0's stop request (only it reads it) or a
    SIGTERM on any process (`terminated`, this process's): decided once, on every process, so
    they all run (and save) the same steps; one that stopped alone would leave the others
    waiting in the next step's collectives."""
    requested, term = collectives.any_process([hooks.stop_requested(), terminated])
    return StopDecision(stop=requested or term, terminated=term)


def resume(
    hooks: TrainerHooks, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
) -> ResumePoint | None:
    """``hooks.resume(...)`` on every process: process 0 plans, every process restores its
    shards of that step (`tpu_jobs.rcp.callbacks.restore_point`)."""
    return hooks.resume(params_like, state_like, past_corrupt=past_corrupt)


class FollowerHooks:
    """`TrainerHooks` of a process other than 0: it writes no MLLOG and no manifest; it takes
    part in every collective save and restore of process 0's choosing."""

    def __init__(self, run_dir: str, val_start_at: int, *, full_state_every: int = 1) -> None:
        self.val_start_at = val_start_at
        self.full_state_every = full_state_every
        self.saver = CheckpointSaver(RunLayout(run_dir).checkpoints_dir)

    @property
    def save_wait_s(self) -> float:
        return self.saver.waited_s

    def resume(
        self, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
    ) -> ResumePoint | None:
        """The step process 0 resumes from (`past_corrupt` is process 0's to act on)."""
        failed, step, finished = collectives.from_primary([0, 0, 0])
        if failed:
            raise CheckpointError(
                "process 0 could not resume the run folder (its error line says why)"
            )
        return restore_point(self.saver, step, bool(finished), params_like, state_like)

    def on_init_start(self, time_ms: int | None = None) -> None:
        pass

    def on_run_start(self, time_ms: int | None = None) -> None:
        pass

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        return save_update(
            self.saver,
            step,
            params,
            state,
            timestamp=now_ms,  # process 0's is the one recorded
            full_state_every=self.full_state_every,
            val_start_at=self.val_start_at,
        )

    def stop_requested(self) -> bool:
        return False  # process 0 reads the request; `stop_decision` tells every process

    def on_train_end(self) -> None:
        self.saver.wait()
        self.saver.close()

    def __enter__(self) -> FollowerHooks:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            close_after_failure(self.saver, exc)
