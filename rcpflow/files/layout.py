"""Where the files of one run live, for a local folder or a ``gs://bucket/prefix``.

<run_dir>/mllog/seed_<seed>.out          the MLLOG
<run_dir>/mllog/eval_checkpoints.jsonl   the manifest of saved checkpoints
<run_dir>/checkpoints/<step>/            Orbax checkpoint of that step
<run_dir>/eval/step_<step>/summary.json  evaluation of that checkpoint (+ attempts/)
<run_dir>/stop_request.json              the verdict is decided: the trainer may stop
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

MANIFEST_NAME = "eval_checkpoints.jsonl"


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def join(base: str, *parts: str) -> str:
    """Join path parts; ``gs://`` paths always use ``/``."""
    if is_gcs(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def dirname(path: str) -> str:
    if is_gcs(path):
        return posixpath.dirname(path.rstrip("/"))
    return os.path.dirname(path)


def resolve(base_dir: str, path: str) -> str:
    """`path` if absolute (or ``gs://``), else relative to `base_dir`."""
    if is_gcs(path) or os.path.isabs(path):
        return path
    if is_gcs(base_dir):
        return "gs://" + posixpath.normpath(posixpath.join(base_dir[len("gs://") :], path))
    return os.path.normpath(os.path.join(base_dir, path))


def normalized(path: str) -> str:
    """`path` made comparable: absolute and normalised (``gs://`` paths without ``..``)."""
    if is_gcs(path):
        return "gs://" + posixpath.normpath(path[len("gs://") :])
    return os.path.abspath(path)


def normalize_root(root: str) -> str:
    if is_gcs(root):
        return root.rstrip("/")
    return os.path.abspath(root)


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run (one seed of a submission)."""

    root: str

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("run_dir must not be empty")
        object.__setattr__(self, "root", normalize_root(self.root))

    @property
    def mllog_dir(self) -> str:
        return join(self.root, "mllog")

    @property
    def manifest(self) -> str:
        return join(self.mllog_dir, MANIFEST_NAME)

    def mllog(self, seed: int) -> str:
        return join(self.mllog_dir, f"seed_{seed}.out")

    @property
    def checkpoints_dir(self) -> str:
        return join(self.root, "checkpoints")

    def checkpoint(self, step: int) -> str:
        return join(self.checkpoints_dir, str(step))

    @property
    def eval_root(self) -> str:
        return join(self.root, "eval")

    def eval_dir(self, step: int) -> str:
        return join(self.eval_root, f"step_{step}")

    def summary(self, step: int) -> str:
        return join(self.eval_dir(step), "summary.json")

    def attempts_dir(self, step: int) -> str:
        return join(self.eval_dir(step), "attempts")

    @property
    def stop_request(self) -> str:
        """Where the orchestrator asks the trainer to stop, once the verdict is decided."""
        return join(self.root, "stop_request.json")
