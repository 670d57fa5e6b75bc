"""Reading checkpoints (`tpu_jobs.rcp.checkpoint_format`) without their saver: the meta record,
a readability check, and the params for evaluation, whatever number of processes wrote them:
as numpy on one process (`restore_params`), or laid over a mesh by the training rule on every
process of a job, each reading only its own shards (`restore_sharded_params`).

Every read verifies the weights against the fingerprint recorded at save time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh

from tpu_jobs.rcp import collectives, sharding
from tpu_jobs.rcp.checkpoint_format import (
    COMMIT_MARKER,
    META_ITEM,
    PARAMS_ITEM,
    STATE_ITEM,
    CheckpointError,
    CheckpointMeta,
    handlers,
    is_complete,
    local_multiprocessing,
)
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError, verify_fingerprint

PyTree = Any


def _numpy_restore_args(tree_metadata: PyTree) -> PyTree:
    return jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree_metadata)


def _reader() -> ocp.Checkpointer:
    # All items registered, even those a caller does not restore, so Orbax does not warn about
    # an item it cannot handle.
    return ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(**handlers()),
        multiprocessing_options=local_multiprocessing(),
    )


def read_meta(step_path: str) -> CheckpointMeta:
    """The ``meta`` item of a complete checkpoint folder."""
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    restored = _reader().restore(
        epath.Path(step_path), args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
    )
    return CheckpointMeta.from_json(restored[META_ITEM], where=step_path)


def check_readable(step_path: str) -> None:
    """Read every item of a complete checkpoint on its own terms (its own tree metadata, numpy
    arrays) and verify the weights against its recorded fingerprint; raises naming the folder.

    Tells a checkpoint that is broken on storage from one that does not fit what a caller tries
    to restore it into (another model): the second reads fine here.
    """
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    reader = _reader()
    path = epath.Path(step_path)
    try:
        items = reader.metadata(path).item_metadata
        restored = reader.restore(
            path,
            args=ocp.args.Composite(
                **{
                    item: ocp.args.PyTreeRestore(restore_args=_numpy_restore_args(items[item].tree))
                    for item in (PARAMS_ITEM, STATE_ITEM)
                    if item in items and items[item] is not None  # a weights-only step
                },
                **{META_ITEM: ocp.args.JsonRestore()},
            ),
        )
        meta = CheckpointMeta.from_json(restored[META_ITEM], where=step_path)
        verify_fingerprint(restored[PARAMS_ITEM], meta.weights_fingerprint, where=step_path)
    except (CheckpointError, FingerprintMismatchError):
        raise
    except Exception as e:  # whatever Orbax or tensorstore raise on a broken folder
        raise CheckpointError(f"{step_path}: cannot be read: {e!r}") from e


def _restore_params(
    step_path: str, restore_args: Callable[[PyTree], PyTree]
) -> tuple[PyTree, CheckpointMeta]:
    """The params item (read with ``restore_args(tree_metadata)``) and the meta record."""
    if not is_complete(step_path):
        raise CheckpointError(f"{step_path}: not a complete checkpoint (no {COMMIT_MARKER})")
    reader = _reader()
    path = epath.Path(step_path)
    try:
        tree_metadata = reader.metadata(path).item_metadata[PARAMS_ITEM].tree
        restored = reader.restore(
            path,
            args=ocp.args.Composite(
                **{
                    PARAMS_ITEM: ocp.args.PyTreeRestore(restore_args=restore_args(tree_metadata)),
                    META_ITEM: ocp.args.JsonRestore(),
                }
            ),
        )
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{step_path}: restore failed: {e!r}") from e
    return restored[PARAMS_ITEM], CheckpointMeta.from_json(restored[META_ITEM], where=step_path)


def _verified(
    step_path: str, params: PyTree, meta: CheckpointMeta, expected_fingerprint: str | None
) -> tuple[PyTree, CheckpointMeta]:
    if expected_fingerprint is not None and expected_fingerprint != meta.weights_fingerprint:
        raise FingerprintMismatchError(
            f"{step_path}: checkpoint records fingerprint {meta.weights_fingerprint}, the "
            f"manifest expects {expected_fingerprint}: not the checkpoint the manifest recorded"
        )
    verify_fingerprint(params, expected_fingerprint or meta.weights_fingerprint, where=step_path)
    return params, meta


def restore_params(
    step_path: str, expected_fingerprint: str | None = None
) -> tuple[PyTree, CheckpointMeta]:
    """Read the scanned params of a complete checkpoint as numpy arrays and verify them.

    `expected_fingerprint` is the manifest row's; without one (standalone evaluation) the
    checkpoint's own recorded fingerprint is the reference. Raises `CheckpointError` or
    `FingerprintMismatchError` naming the checkpoint.
    """
    params, meta = _restore_params(step_path, _numpy_restore_args)
    return _verified(step_path, params, meta, expected_fingerprint)


def restore_sharded_params(
    step_path: str, expected_fingerprint: str | None, m: Mesh
) -> tuple[PyTree, CheckpointMeta]:
    """`restore_params` on every process of a job together: each leaf laid over `m` as
    training lays it (`sharding.tree_shardings`), each process reading only the shards its
    devices hold. A restore that fails on any process raises `CheckpointError` on all (none is
    left waiting in the next collective); the fingerprint is then verified on device, together.
    """

    def sharded_args(tree_metadata: PyTree) -> PyTree:
        return jax.tree.map(
            lambda leaf: ocp.ArrayRestoreArgs(
                sharding=sharding.leaf_sharding(m, tuple(leaf.shape)),
                global_shape=tuple(leaf.shape),
                dtype=leaf.dtype,
            ),
            tree_metadata,
        )

    error: Exception | None = None
    try:
        params, meta = _restore_params(step_path, sharded_args)
    except Exception as e:  # every process must still agree below
        error = e
    [failed] = collectives.any_process([error is not None])
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(
            f"{step_path}: restore failed on another process of this job (its error line says why)"
        )
    return _verified(step_path, params, meta, expected_fingerprint)
