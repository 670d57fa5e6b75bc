"""The toy trainer's evaluator (``python -m tpu_jobs.evaluate``): `ToyCheckpoints` for the shared
evaluator (`tpu_jobs.eval.cli`, which has the flags and the exit codes). A worker may be several
processes (one `jax.distributed` system): the params are restored sharded over all their devices
as training lays them, each process reading its own shards."""

from __future__ import annotations

from collections.abc import Sequence

from tpu_jobs.eval import cli
from tpu_jobs.eval.target import CheckpointFacts, LoadedCheckpoint
from tpu_jobs.rcp import sharding
from tpu_jobs.rcp.callbacks import RUN_IDENTITY_KEY
from tpu_jobs.rcp.checkpoint_format import CheckpointMeta
from tpu_jobs.rcp.checkpoint_restore import restore_sharded_params
from tpu_jobs.toy.eval_sampling import EVAL_BATCH_ROWS, run_attempts
from tpu_jobs.toy.model import MODEL_CONFIG_KEY, ModelConfig

PROG = "python -m tpu_jobs.evaluate"


def model_config(meta: CheckpointMeta, where: str) -> ModelConfig:
    if MODEL_CONFIG_KEY not in meta.extra:
        raise ValueError(
            f"{where}: checkpoint records no {MODEL_CONFIG_KEY!r}; cannot build the model"
        )
    return ModelConfig(**meta.extra[MODEL_CONFIG_KEY])


class ToyCheckpoints:
    """The toy trainer's checkpoints (`tpu_jobs.rcp` layout, `ModelConfig` in their extra)."""

    batch_rows = EVAL_BATCH_ROWS
    multi_process = True

    def load(self, path: str, expected_fingerprint: str | None) -> LoadedCheckpoint:
        m = sharding.mesh()
        params, meta = restore_sharded_params(path, expected_fingerprint, m)
        gbs = int(meta.extra[RUN_IDENTITY_KEY]["global_batch_size"])
        cfg = model_config(meta, path)
        return LoadedCheckpoint(
            facts=CheckpointFacts(meta.step, meta.timestamp_ms, meta.step * gbs),
            attempts=lambda instances: run_attempts(cfg, params, instances, m),
        )


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(
        argv,
        ToyCheckpoints(),
        prog=PROG,
        description="The evaluator: pass@4 of one checkpoint on 251 instances.",
    )
