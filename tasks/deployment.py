"""Deployment settings: which backend runs the jobs, where runs are stored, the eval window.

Read at DAG-parse time, cheaply: a TOML file named by ``RCPFLOW_DEPLOYMENT``, else the embedded
local default; relative paths resolve against the file's folder. A backend's own table (``[gke]``)
is read by the settings class its backend registers (`register_table`), so this module imports
no backend and knows none by name: which names exist and what each backend makes of the
``[jobs]`` keys only some run (an image, Secret envs) is the registry's
(`tasks.backend_api.protocol`). Import `tasks.backends.registry` before loading a deployment
that has a backend table.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from rcpflow.recipe import MAX_STEPS_LIMIT, Division
from rcpflow.retention.rule import KEEPS, Keep

# When a run's checkpoints are evaluated (README: "Evaluation schedule"); the MLLOG is the same.
from rcpflow.verdict.schedule import DEFAULT_SCHEDULE, EvalSchedule
from tasks.jobs.templates import Jobs, check_plain_env
from tasks.settings import SettingError, read_table

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_VAR = "RCPFLOW_DEPLOYMENT"
REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = "<embedded default>"

# A backend's name, as its class registers it (`tasks.backend_api.protocol.register`); the
# names are the registry's, so this module checks only the shape of one.
BackendName = str
BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# A Celery queue name as `airflow celery worker --queues` takes it (a comma list: no commas).
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")

T = TypeVar("T")
# A backend's settings table (name -> its frozen dataclass), registered by the backend's module.
_TABLES: dict[str, type[DataclassInstance]] = {}


def register_table(name: str, cls: type[DataclassInstance]) -> None:
    """Read the deployment's table `name` (``[gke]``) into `cls`, typed by its fields."""
    if _TABLES.setdefault(name, cls) is not cls:
        raise ValueError(f"settings table [{name}] is already registered ({_TABLES[name]})")


DEFAULT_TOML = """
backend = "local"
storage_root = "runs"
eval_window = 1
eval_schedule = "after_training"
submission_schedule = ""
train_timeout_minutes = 60
eval_timeout_minutes = 30
eval_retries = 0

[job_env]
JAX_PLATFORMS = "cpu"
"""


@dataclass(frozen=True)
class FormOverrides:
    """``[form_defaults]``: where the trigger forms start, if not where the backend's defaults
    do (`tasks.backend_api.protocol.form_defaults`); keys left out keep the backend's."""

    division: Division | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.max_steps is not None and not 1 <= self.max_steps <= MAX_STEPS_LIMIT:
            raise SettingError(
                "max_steps", f"must be in 1..{MAX_STEPS_LIMIT}, got {self.max_steps}"
            )


# The run DAG's retention choices: off, or which evaluated checkpoints stay (rcpflow.verdict.
# retention.RetentionPolicy.keep); also the values of the run DAG's ``retention`` Param.
RetentionChoice = Literal["off", Keep]
RETENTION_CHOICES: tuple[str, ...] = ("off", *KEEPS)
MAX_RETENTION_LAST_K = 1000  # more evaluated checkpoints than a run saves: keep them all


@dataclass(frozen=True)
class RetentionSettings:
    """``[retention]``: whether the run DAG deletes the checkpoints no verdict needs any more
    (`tasks.run.retention`, docs/retention.md), and how; the run's ``retention`` Param
    overrides `keep` per run."""

    # off (the default): nothing is deleted; passing / last-k / nothing: what stays of the
    # evaluated checkpoints once the rule lets the others go.
    keep: RetentionChoice = "off"
    last_k: int = 1  # with keep = "last-k"
    # Also after each step's evaluation while training runs (evaluated checkpoints only; the
    # newest full state stays): only for a trainer whose resume tolerates missing rows.
    while_training: bool = False
    # After the run's evaluations are all done: the unevaluated checkpoints above the passing
    # step go too (no evaluation of them is running or will start then).
    settled: bool = True
    # The train job's own checkpoint tree ([jobs.train] result, NeMo-RL's) outside the run's
    # checkpoints/ may be deleted from; rcpflow's own tree always may.
    foreign_trees: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.last_k <= MAX_RETENTION_LAST_K:
            raise SettingError("last_k", f"must be in 0..{MAX_RETENTION_LAST_K}, got {self.last_k}")


# The ranges of the deployment's numbers (beyond the settings reader's int32 and 1e9 bounds).
# MAX_EVAL_WINDOW: also the runs' eval_window Param's maximum (tasks.run.spec), the ceiling the
# evaluate task's max_active_tis_per_dagrun is set to (the run's window is held by the waits).
MAX_EVAL_WINDOW = 64
MAX_TIMEOUT_MINUTES = 60 * 24 * 31  # a job of a month
MAX_RETRIES = 100
MAX_POLL_SECONDS = 3600.0


class DeploymentError(ValueError):
    """The deployment file is unusable; the message names the file and the key."""


@dataclass(frozen=True)
class Deployment:
    """Parse-time settings of one Airflow deployment of rcpflow (the keys of the file)."""

    source: str  # the file these came from, or EMBEDDED; not a key of the file
    backend: BackendName = "local"
    storage_root: str = str(REPO_ROOT / "runs")
    # Whether a run_dir Param (run and deferred-eval DAGs; a submission's storage_root) may
    # name a folder outside storage_root, where the RCP view cannot show it.
    allow_run_dirs_outside_root: bool = False
    # How many checkpoints of one run are evaluated at once (the default of the runs'
    # eval_window Param; the deferred-eval DAG's max_active_tis_per_dagrun): 1 = strictly in
    # step order, more = speculative (faster verdict, some wasted evaluation).
    eval_window: int = 1
    # after_training: evaluate the manifest's rows once training has ended; during_training:
    # evaluate each planned step as soon as its checkpoint is committed, and ask the trainer
    # to stop once the verdict is decided (tasks.run.evaluation_over_steps). The default of the
    # runs' Param.
    eval_schedule: EvalSchedule = DEFAULT_SCHEDULE
    # How often a waiting step reads the run's files and task states.
    checkpoint_poll_seconds: float = 5.0
    # Interpreter of local jobs; empty means the Airflow worker's own (its venv has tpu_jobs).
    python: str = ""
    # Cron expression or preset for mlperf_grpo_submission; empty = triggered only.
    submission_schedule: str = ""
    train_timeout_minutes: int = 60
    eval_timeout_minutes: int = 30
    eval_retries: int = 0
    # Extra environment of local jobs (e.g. JAX_PLATFORMS=cpu).
    job_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The backends' own tables that the file has ([gke]: GkeSettings), by table name; not a
    # key of the file (see `register_table`).
    tables: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # The [jobs] table: command, env, image of each job, the evaluate job's result.
    jobs: Jobs = field(default_factory=Jobs)
    # The [form_defaults] table; None: the backend's defaults.
    form_defaults: FormOverrides | None = None
    # The [retention] table: off unless it says which checkpoints stay.
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # The executor's queue of every task that talks to a cluster (submits, watches, cancels
    # its jobs), e.g. the Celery workers on a Slurm login node; empty: Airflow's default
    # queue ([operators] default_queue). docs/deploy.md, Queues.
    cluster_queue: str = ""

    def __post_init__(self) -> None:
        check_plain_env("job_env", self.job_env, reserved=False)  # as [jobs.*.env]: names
        if not BACKEND_NAME.fullmatch(self.backend):
            raise SettingError(
                "backend", f"{self.backend!r} is not a backend name ({BACKEND_NAME.pattern})"
            )
        for name, value, minimum, maximum in (
            ("eval_window", self.eval_window, 1, MAX_EVAL_WINDOW),
            ("train_timeout_minutes", self.train_timeout_minutes, 1, MAX_TIMEOUT_MINUTES),
            ("eval_timeout_minutes", self.eval_timeout_minutes, 1, MAX_TIMEOUT_MINUTES),
            ("eval_retries", self.eval_retries, 0, MAX_RETRIES),
        ):
            if value < minimum:
                raise SettingError(name, f"must be >= {minimum}, got {value}")
            if value > maximum:
                raise SettingError(name, f"must be <= {maximum}, got {value}")
        if self.checkpoint_poll_seconds <= 0:
            raise SettingError(
                "checkpoint_poll_seconds", f"must be > 0, got {self.checkpoint_poll_seconds}"
            )
        if self.checkpoint_poll_seconds > MAX_POLL_SECONDS:
            raise SettingError(
                "checkpoint_poll_seconds",
                f"must be <= {MAX_POLL_SECONDS:g}, got {self.checkpoint_poll_seconds}",
            )
        if not self.storage_root:
            raise SettingError("storage_root", "must not be empty")
        if self.cluster_queue and not QUEUE_NAME.fullmatch(self.cluster_queue):
            raise SettingError(
                "cluster_queue",
                f"{self.cluster_queue!r} is not a queue name ({QUEUE_NAME.pattern})",
            )

    def table(self, name: str, cls: type[T]) -> T | None:
        """The backend table `name` as `cls`; None when the file has none."""
        found = self.tables.get(name)
        if found is not None and not isinstance(found, cls):
            raise TypeError(f"[{name}] was read as {type(found).__name__}, not {cls.__name__}")
        return found

    def backend_table(self, name: str, cls: type[T]) -> T:
        """The table of the backend `name` (``[gke]`` for gke) as `cls`; the backend cannot
        run without it."""
        found = self.table(name, cls)
        if found is None:
            raise DeploymentError(f"{self.source}: backend {name!r} needs a [{name}] table")
        return found

    def cluster_task_kwargs(self) -> dict[str, str]:
        """What every operator that talks to a cluster is given: its `cluster_queue`."""
        return {"queue": self.cluster_queue} if self.cluster_queue else {}

    @property
    def job_python(self) -> str:
        return self.python or sys.executable

    @property
    def schedule(self) -> str | None:
        return self.submission_schedule or None


_FIELDS = frozenset(f.name for f in dataclasses.fields(Deployment))


def parse_deployment(text: str, *, source: str, base_dir: Path) -> Deployment:
    """Settings from TOML text; unknown keys and wrong types are errors naming the key."""
    try:
        table = tomllib.loads(text)
        tables = {k: read_table(_TABLES[k], v, k) for k, v in table.items() if k in _TABLES}
        rest = {k: v for k, v in table.items() if k not in _TABLES}
        for name, value in rest.items():
            # A table that is no key of the file: a backend's, whose module nobody imported.
            if isinstance(value, dict) and name not in _FIELDS:
                raise SettingError(
                    name,
                    f"no key of the deployment and no registered backend's settings table "
                    f"(registered: {', '.join(sorted(_TABLES)) or 'none'}; import "
                    "tasks.backends.registry before loading a deployment)",
                )
        fixed = {"source": source, "tables": MappingProxyType(tables)}
        deployment = read_table(Deployment, rest, fixed=fixed)
    except tomllib.TOMLDecodeError as exc:
        raise DeploymentError(f"{source}: not valid TOML: {exc}") from exc
    except SettingError as exc:
        raise DeploymentError(f"{source}: {exc}") from exc
    root, python = deployment.storage_root, deployment.python
    if "storage_root" in table:
        root = root.rstrip("/") if root.startswith("gs://") else str((base_dir / root).resolve())
    if os.sep in python:
        python = str((base_dir / python).resolve())
    return dataclasses.replace(deployment, storage_root=root, python=python)


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> Deployment:
    if path is None:
        return parse_deployment(DEFAULT_TOML, source=EMBEDDED, base_dir=REPO_ROOT)
    file = Path(path).expanduser().resolve()
    try:
        text = file.read_text()
    except OSError as exc:
        raise DeploymentError(f"{ENV_VAR}={path}: cannot read it: {exc}") from exc
    return parse_deployment(text, source=str(file), base_dir=file.parent)


def load_deployment() -> Deployment:
    """The deployment named by ``$RCPFLOW_DEPLOYMENT``, else the embedded local default."""
    return _load(os.environ.get(ENV_VAR) or None)
