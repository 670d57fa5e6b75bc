"""One training job over several processes (the hosts of a TPU slice): the process layout the
JobSet gives each pod, `jax.distributed` from it, and what the processes other than 0 do.

The layout comes from RCPFLOW_COORDINATOR_ADDRESS / RCPFLOW_NUM_PROCESSES / RCPFLOW_PROCESS_ID
(tasks.backends.gke.render sets them on a multi-host slice); without them the job is one
process and nothing here changes it. All processes form one system and run the same jitted
step on global arrays (`replicate`).

Process 0 is the only writer of the MLLOG, the manifest and the checkpoints: the toy policy's
parameters and optimizer state are replicated, so process 0 holds all of them, and its Orbax
readers and writers are limited to itself (`tpu_jobs.checkpoint.local_multiprocessing`), so
its background saves wait on no other process. The other processes run `FollowerHooks`: they
restore the step process 0 resumes from (broadcast from it) and write nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rcpflow.layout import RunLayout, join
from rcpflow.recorder import now_ms
from tpu_jobs.checkpoint import read_meta, restore_train_state_numpy
from tpu_jobs.rcp_hooks import RcpHooks, ResumePoint

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


def stop_requested(hooks: RcpHooks | FollowerHooks) -> bool:
    """After a step: does the run stop here? Process 0 reads the stop request (only it has
    the recorder) and every process gets its answer: they all run the same steps, and one
    that stopped alone would leave the others waiting in the next step's collectives."""
    mine = hooks.stop_requested() if isinstance(hooks, RcpHooks) else False
    if jax.process_count() == 1:
        return mine
    return bool(multihost_utils.broadcast_one_to_all(np.array(int(mine), np.int64)))


def resume(
    hooks: RcpHooks | FollowerHooks, params_like: PyTree, state_like: PyTree, **options: Any
) -> ResumePoint | None:
    """``hooks.resume(params_like=..., state_like=..., **options)`` on process 0 (the only
    process of a one-process job); the others restore the step it chose."""
    if isinstance(hooks, RcpHooks):
        point = hooks.resume(params_like=params_like, state_like=state_like, **options)
        if jax.process_count() > 1:
            broadcast_resume(point)
        return point
    step, finished = broadcast_resume(None)
    return hooks.restore(step, finished, params_like, state_like)


class FollowerHooks:
    """The `RcpHooks` calls a trainer makes, for a process other than 0: it writes nothing
    (no MLLOG, manifest or checkpoint) and restores what process 0 resumes from."""

    def __init__(self, run_dir: str) -> None:
        # Not a CheckpointSaver: opening one cleans up half-written step folders, which on a
        # follower would be process 0's saves in progress.
        self._checkpoints_dir = RunLayout(run_dir).checkpoints_dir

    def restore(
        self, step: int, finished: bool, params_like: PyTree, state_like: PyTree
    ) -> ResumePoint | None:
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

    def on_train_end(self) -> None:
        pass

    def __enter__(self) -> FollowerHooks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass
