"""One training job over several processes (the hosts of a TPU slice): the layout from the
environment, `jax.distributed` from it, and `FollowerHooks` for every process but 0.

RCPFLOW_COORDINATOR_ADDRESS / RCPFLOW_NUM_PROCESSES / RCPFLOW_PROCESS_ID (set by
tasks.backends.gke.render) give the layout; without them the job is one process. Process 0
alone writes the MLLOG, the manifest and the checkpoints; what it decides (where to resume,
whether to stop) is broadcast to the others (docs/tpu_jobs.md has the why).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rcpflow.layout import RunLayout, join
from rcpflow.recorder import now_ms
from tpu_jobs.rcp.checkpoint_restore import read_meta, restore_train_state_numpy
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

    @property
    def is_primary(self) -> bool:
        return self.process_id == 0


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


def replicate(tree: PyTree) -> PyTree:
    """`tree` (this process's copy, identical on every process) as global arrays replicated on
    every device of the system: what the jitted step takes on several processes."""
    if jax.process_count() == 1:
        return tree
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec())

    def one(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(leaf))
            array = jax.make_array_from_callback(data.shape, sharding, lambda i: data[i])
            return jax.random.wrap_key_data(array, impl=jax.random.key_impl(leaf))
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

    return jax.tree.map(one, tree)


def broadcast_resume(point: ResumePoint | None) -> tuple[int, bool]:
    """(step, finished) of process 0's resume point (0: a fresh run), on every process."""
    mine = np.array([0, 0] if point is None else [point.step, int(point.finished)], np.int64)
    got = multihost_utils.broadcast_one_to_all(mine)
    return int(got[0]), bool(got[1])


def stop_requested(hooks: TrainerHooks) -> bool:
    """After a step: does the run stop here? Process 0's answer (only it reads the stop request)
    on every process: they all run the same steps, and one that stopped alone would leave the
    others waiting in the next step's collectives."""
    mine = hooks.stop_requested()
    if jax.process_count() == 1:
        return mine
    return bool(multihost_utils.broadcast_one_to_all(np.array(int(mine), np.int64)))


def resume(
    hooks: TrainerHooks, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
) -> ResumePoint | None:
    """``hooks.resume(...)`` on every process; process 0's choice is broadcast to the others,
    whose `FollowerHooks.resume` receives it and restores that step."""
    point = hooks.resume(params_like, state_like, past_corrupt=past_corrupt)
    if jax.process_count() > 1 and jax.process_index() == 0:
        broadcast_resume(point)
    return point


class FollowerHooks:
    """`TrainerHooks` of a process other than 0: it writes nothing (no MLLOG, manifest or
    checkpoint) and restores what process 0 resumes from."""

    def __init__(self, run_dir: str) -> None:
        # Not a CheckpointSaver: opening one cleans up half-written step folders, which on a
        # follower would be process 0's saves in progress.
        self._checkpoints_dir = RunLayout(run_dir).checkpoints_dir

    def resume(
        self, params_like: PyTree, state_like: PyTree, *, past_corrupt: bool = False
    ) -> ResumePoint | None:
        """The step process 0 resumes from (`past_corrupt` is process 0's to act on)."""
        step, finished = broadcast_resume(None)
        if step == 0:
            return None
        path = join(self._checkpoints_dir, str(step))
        params, state = restore_train_state_numpy(path, params_like, state_like)
        return ResumePoint(
            step=step,
            params=params,
            state=state,
            timestamp_ms=read_meta(path).timestamp_ms,
            finished=finished,
        )

    def on_init_start(self, time_ms: int | None = None) -> None:
        pass

    def on_run_start(self, time_ms: int | None = None) -> None:
        pass

    def after_update(self, step: int, params: PyTree, state: PyTree) -> int:
        jax.block_until_ready(params)
        return now_ms()

    def stop_requested(self) -> bool:
        return False  # process 0 reads the request; `stop_requested` broadcasts its answer

    def on_train_end(self) -> None:
        pass

    def __enter__(self) -> FollowerHooks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass  # nothing queued, nothing to finish
