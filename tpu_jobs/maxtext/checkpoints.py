"""MaxText's native checkpoints, as this job saves (`WithRecord`, `CommitWatch`) and reads them
(`complete_steps`, `read_record`).

``<run_dir>/checkpoints/<step>/`` is MaxText's own step folder (Orbax v1 ``training``
Checkpointer): ``items/`` (the full train state in MaxText's Linen on-disk layout:
``params.params.decoder.layers.*`` stacked on axis 1, ``opt_state``, ``step``),
``_CHECKPOINT_METADATA`` and ``commit_success.txt``, written only once the step has committed.
MaxText puts its own ``custom_metadata`` (``scan_layers``) in the metadata; this job adds its
`CheckpointRecord` of the step there under `RCPFLOW_KEY`, in the same atomic commit, so a
checkpoint never exists without the update time and fingerprints it was recorded with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tpu_jobs.rcp.checkpoint_format import CheckpointError, is_complete
from tpu_jobs.rcp.native_checkpoints import (
    RCPFLOW_KEY,
    StepRecord,
    metadata_path,
    read_custom_metadata,
    wait_for_commit,
)
from tpu_jobs.rcp.saver import OrderedSaveQueue

ITEMS = "items"
COMMIT_TIMEOUT_S = 1800.0


def step_path(checkpoints_dir: str, step: int) -> str:
    return join(checkpoints_dir, str(step))


def items_path(step_folder: str) -> str:
    """The Orbax tree MaxText's converter reads (``load_full_state_path``)."""
    return join(step_folder, ITEMS)


def complete_steps(checkpoints_dir: str) -> list[int]:
    """Committed steps, ascending; half-written ones (no marker, temporary folders) are not."""
    names = storage_for(checkpoints_dir).subfolders(checkpoints_dir)
    steps = [int(n) for n in names if n.isdigit()]
    return sorted(s for s in steps if is_complete(step_path(checkpoints_dir, s)))


@dataclass(frozen=True)
class CheckpointRecord(StepRecord):
    """What this job writes into a checkpoint's metadata about its step.

    `weights_fingerprint` is of the scanned parameters as trained (float32: the checkpoint's own
    bits, what the manifest row names); `weights_fingerprint_bf16` is of the same scanned tree
    rounded to bfloat16 (round to nearest even, as MaxText's converter casts it): what the
    evaluator's unscanned weights, put back in the scanned layout, must fingerprint to.
    """

    weights_fingerprint_bf16: str
    model: Mapping[str, int]  # `tpu_jobs.maxtext.config.ModelConfig` fields

    @classmethod
    def own_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "weights_fingerprint_bf16": str(d["weights_fingerprint_bf16"]),
            "model": dict(d["model"]),
        }


def read_record(step_folder: str) -> CheckpointRecord:
    """This job's record of a committed step folder; MaxText's own `scan_layers` must say the
    checkpoint is scanned."""
    custom = read_custom_metadata(step_folder)
    where = metadata_path(step_folder)
    if custom.get("scan_layers") is not True:
        raise CheckpointError(f"{where}: not a scanned MaxText checkpoint ({custom!r})")
    return CheckpointRecord.in_metadata(custom, where)


def read_scanned_params(step_folder: str) -> dict[str, Any]:
    """The model parameters of a scanned training checkpoint as host numpy arrays, read with
    Orbax from MaxText's on-disk layout (``items/params.params.<tree>``: float32, the decoder's
    layers stacked on the scan axis); the optimizer state is not read. For the tests and the
    bench (`devtools.bench.maxtext_bench`): the evaluator reads a step through MaxText's
    converter instead."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath

    item = epath.Path(items_path(step_folder))
    reader = ocp.PyTreeCheckpointer()
    wanted = {"params": reader.metadata(item).item_metadata.tree["params"]}
    restored = reader.restore(
        item,
        args=ocp.args.PyTreeRestore(
            item=wanted,
            restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted),
            partial_restore=True,
        ),
    )
    return restored["params"]["params"]


class WithRecord:
    """MaxText's checkpointer for one save, with `record` added to the step's custom metadata.

    MaxText's ``checkpointing.save_checkpoint`` calls ``save_checkpointables(_async)`` with its
    own metadata; everything else goes to the checkpointer it wraps."""

    def __init__(self, checkpointer: Any, record: CheckpointRecord) -> None:
        self._checkpointer = checkpointer
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._checkpointer, name)

    def _metadata(self, step: int, custom_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        if step != self._record.step:
            raise CheckpointError(
                f"step {step}: MaxText saved it with step {self._record.step}'s record"
            )
        return {**dict(custom_metadata or {}), RCPFLOW_KEY: self._record.to_json()}

    def save_checkpointables(
        self, step: int, checkpointables: Any, *, custom_metadata: Any = None, **kwargs: Any
    ) -> Any:
        return self._checkpointer.save_checkpointables(
            step, checkpointables, custom_metadata=self._metadata(step, custom_metadata), **kwargs
        )

    def save_checkpointables_async(
        self, step: int, checkpointables: Any, *, custom_metadata: Any = None, **kwargs: Any
    ) -> Any:
        return self._checkpointer.save_checkpointables_async(
            step, checkpointables, custom_metadata=self._metadata(step, custom_metadata), **kwargs
        )


@dataclass(frozen=True)
class CommittedStep:
    step: int
    path: str


class CommitWatch:
    """Hands each saved step to `on_commit` once MaxText's async save has committed it, in step
    order, from one thread (`tpu_jobs.rcp.saver.OrderedSaveQueue`): the manifest row comes after
    the commit, and the loop waits only while `max_pending` steps are uncommitted."""

    def __init__(
        self,
        checkpoints_dir: str,
        on_commit: Callable[[CommittedStep], None],
        *,
        max_pending: int = 2,
        timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self.checkpoints_dir = checkpoints_dir
        self._timeout_s = timeout_s
        self._queue: OrderedSaveQueue[int, CommittedStep] = OrderedSaveQueue(
            self._wait,
            max_pending=max_pending,
            on_commit=on_commit,
            thread_name=f"maxtext-commit-watch:{checkpoints_dir}",
        )

    def _wait(self, step: int) -> CommittedStep:
        path = step_path(self.checkpoints_dir, step)
        wait_for_commit(path, step, self._timeout_s)
        return CommittedStep(step, path)

    def expect(self, step: int) -> None:
        """Watch for `step` (saves started in increasing step order); raises `SaveFailedError`
        if an earlier step's commit or row failed."""
        self._queue.put(step, lambda: step)

    @property
    def waited_s(self) -> float:
        return self._queue.waited_s

    def close(self) -> None:
        """Wait until every expected step has committed and been handed on; raises
        `SaveFailedError` if one failed. Idempotent."""
        self._queue.close()
