"""RCP recording inside Tunix's loop (`StepRecording`) and the run's committed checkpoints as
the recorder resumes from them (`committed_checkpoints`).

Tunix makes one call between an update and the save of its result,
``custom_checkpoint_metadata_fn``: there each update is timed (after blocking on the actor's new
parameters, through their on-device fingerprint from ``val_start_at`` on) and its record goes
into the checkpoint's metadata. A
watcher thread writes the manifest row once Orbax has committed the step (docs/tpu_jobs.md).
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from rcpflow.records.run_identity import RunIdentity
from rcpflow.trainer.recorder import TrainingRecorder
from tpu_jobs.rcp.callbacks import Committed, run_mismatch
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.fingerprint import weights_fingerprint
from tpu_jobs.rcp.job_cli import say
from tpu_jobs.rcp.native_checkpoints import RCPFLOW_KEY
from tpu_jobs.tunix import checkpoints, policy


class StepRecording:
    """RCP recording inside Tunix's loop, on the actor trainer's checkpoint-metadata call.

    Tunix calls ``custom_checkpoint_metadata_fn`` twice per update: before dispatching it (perf
    tags; ``train_steps`` still the previous step's) and right after (as the argument of the save;
    ``train_steps`` already the new step's). The first call that sees a new ``train_steps`` is
    the second one: there the update is recorded.
    """

    def __init__(
        self,
        recorder: TrainingRecorder,
        trainer: Any,
        *,
        val_start_at: int,
        checkpoint_root: str,
        identity: RunIdentity,
        policy_config: policy.ModelConfig,
        last_step: int,
        primary: bool = True,
    ) -> None:
        # A process other than 0 records nothing: it only takes part in the fingerprint (a
        # collective) and leaves the rows to process 0, whose metadata Orbax writes.
        self.primary = primary
        self.recorder = recorder
        self.trainer = trainer
        self.val_start_at = val_start_at
        self.identity = identity
        self.policy_config = policy_config
        self._tunix_metadata = trainer.custom_checkpoint_metadata_fn
        self._last_step = last_step
        self._current: dict[str, Any] = {}
        self._records: dict[int, checkpoints.CheckpointRecord] = {}
        self.watcher = (
            checkpoints.CommitWatcher(checkpoint_root, self._committed) if primary else None
        )
        trainer.custom_checkpoint_metadata_fn = self._metadata

    def _metadata(self) -> dict[str, Any]:
        base = dict(self._tunix_metadata())  # Tunix's own global_step and role stay as they are
        step = self.trainer.train_steps
        if step != self._last_step:
            self._record_update(step)
        return {**base, **self._current}

    def _record_update(self, step: int) -> None:
        if step != self._last_step + 1:
            raise CheckpointError(f"step {step}: Tunix skipped from update {self._last_step}")
        fingerprint = None
        if step >= self.val_start_at:
            # On the device, at memory bandwidth: its result is ready only once every weight
            # of the update is, so this is also the wait before the timestamp.
            fingerprint = weights_fingerprint(policy.params(self.trainer.model))
        else:
            jax.block_until_ready(nnx.state(self.trainer.model, nnx.Param))
        self._last_step = step
        self._current = {}
        if not self.primary:
            return
        timestamp_ms = self.recorder.on_update(step)
        say({"step": step, "timestamp_ms": timestamp_ms})  # progress, as the update happens
        if fingerprint is not None and self.watcher is not None:
            record = checkpoints.CheckpointRecord(
                step=step,
                timestamp_ms=timestamp_ms,
                weights_fingerprint=fingerprint,
                run=self.identity.arguments(),
                policy=self.policy_config.to_json(),
            )
            self._records[step] = record
            self._current = {RCPFLOW_KEY: record.to_json()}
            self.watcher.expect(step)

    def _committed(self, step: int, path: str) -> None:
        _, found = checkpoints.read_record(path)
        if found != self._records[step]:
            raise CheckpointError(f"step {step}: {path} records {found}, not {self._records[step]}")
        self.recorder.on_checkpoint_committed(
            step, path, extra={"weights_fingerprint": found.weights_fingerprint}
        )

    def finish(self) -> None:
        """Wait for the rows of every saved step (Tunix's close has waited for the writes)."""
        if self.watcher is None:
            return
        try:
            self.watcher.drain()
        finally:
            self.watcher.close()


def committed_checkpoints(root: str, identity: RunIdentity, val_start: int) -> list[Committed]:
    """This run's committed checkpoints, ascending; one of another run is an error."""
    found = []
    for step in checkpoints.complete_steps(root):
        path = checkpoints.step_path(root, step)
        global_step, record = checkpoints.read_record(path)
        if record.run != identity.arguments():
            raise run_mismatch(step, path, dict(record.run), identity)
        if record.step != step or global_step != step or step < val_start:
            raise CheckpointError(
                f"step {step}: {path} records step {record.step} (Tunix global_step "
                f"{global_step}); one optimizer update per global step is this job's contract"
            )
        found.append(
            Committed(
                step=step,
                path=path,
                timestamp_ms=record.timestamp_ms,
                weights_fingerprint=record.weights_fingerprint,
            )
        )
    return found
