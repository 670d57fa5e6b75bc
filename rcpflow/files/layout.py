"""Where the files of one run live, for a local folder or a ``gs://bucket/prefix``.

<run_dir>/mllog/seed_<seed>.out          the MLLOG
<run_dir>/mllog/eval_checkpoints.jsonl   the manifest of saved checkpoints
<run_dir>/checkpoints/<step>/            Orbax checkpoint of that step
<run_dir>/eval/step_<step>/summary.json  evaluation of that checkpoint (+ attempts/)
<run_dir>/stop_request.json              the verdict is decided: the trainer may stop
<run_dir>/owner.json                     the lease of the trainer that holds the run
<run_dir>/eval_schedule.json             when the run's checkpoints are evaluated (its plan's)
<run_dir>/retention.json                 what `rcpflow retention apply` deleted, when and why
<run_dir>/.retention.lock                held by the one retention apply running on the run
<run_dir>/eval/step_<step>/evaluating.json  an evaluation of that checkpoint is running
<run_dir>/checks/<tool>.json             the verdict of an official checker (a submission
                                         folder keeps its checkers' verdicts the same way)

Every module that reads or writes one of these asks `RunLayout` (or `check_verdict`) for its
path: one home per file name.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

MANIFEST_NAME = "eval_checkpoints.jsonl"
MLLOG_DIR = "mllog"
CHECKPOINTS_DIR = "checkpoints"
# The full training state inside a checkpoint folder (the rest is weights): the trainer writes
# it (tpu_jobs.rcp.checkpoint_format), retention may delete it alone (rcpflow.retention.rule).
CHECKPOINT_STATE_DIR = "train_state"
CHECKS_DIR = "checks"


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


def mllog_name(seed: int) -> str:
    """Seed `seed`'s MLLOG in ``mllog/`` (the name a manifest row gives, relative to it)."""
    return f"seed_{seed}.out"


def check_verdict_name(tool: str) -> str:
    """A checker's verdict file relative to its folder (how problems name it)."""
    return f"{CHECKS_DIR}/{tool}.json"


def checks_dir(folder: str) -> str:
    """Where a run folder or a submission folder keeps its checkers' verdicts and logs."""
    return join(folder, CHECKS_DIR)


def check_verdict(folder: str, tool: str) -> str:
    """`tool`'s verdict in a run folder or a submission folder."""
    return join(folder, check_verdict_name(tool))


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
        return join(self.root, MLLOG_DIR)

    @property
    def manifest(self) -> str:
        return join(self.mllog_dir, MANIFEST_NAME)

    def mllog(self, seed: int) -> str:
        return join(self.mllog_dir, mllog_name(seed))

    @property
    def checkpoints_dir(self) -> str:
        return join(self.root, CHECKPOINTS_DIR)

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

    @property
    def owner(self) -> str:
        """The lease of the trainer that holds the run (`rcpflow.trainer.ownership`)."""
        return join(self.root, "owner.json")

    @property
    def eval_schedule(self) -> str:
        """The schedule the run's plan recorded (`rcpflow.verdict.schedule_record`)."""
        return join(self.root, "eval_schedule.json")

    @property
    def retention(self) -> str:
        """What retention deleted, when and why (`rcpflow.retention.apply`)."""
        return join(self.root, "retention.json")

    @property
    def retention_lock(self) -> str:
        """Held by the one retention apply running on the run (`rcpflow.retention.lock`)."""
        return join(self.root, ".retention.lock")

    def evaluating(self, step: int) -> str:
        """Present while an evaluator reads `step`'s checkpoint, until its summary is persisted
        (`rcpflow.verdict.evaluating`): retention keeps the checkpoint."""
        return join(self.eval_dir(step), "evaluating.json")

    @property
    def checks_dir(self) -> str:
        return checks_dir(self.root)

    def check(self, tool: str) -> str:
        """The run's verdict of the official checker `tool` (`tasks.results.verdicts`)."""
        return check_verdict(self.root, tool)
