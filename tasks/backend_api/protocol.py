"""What a backend is: a job driver (`JobDriver`), and the registry of drivers by name.

A driver starts, reads and cancels one kind of job (a JobSet, a Slurm job, a local process
group); the lifecycle around it is written once, in this package (`job_operator`,
`watch_trigger`, `teardown`) and in `tasks.run` (the evaluate operator and the nodes a run's
DAG is built of). A driver holds its settings and its cluster calls (hooks, renderers) and
nothing of the lifecycle: it is composed, never subclassed. Each driver module registers its
class here (`register`); this module imports none of them. Code that needs one by name imports
`tasks.backends.registry`, which imports them all. The names are the registry's: a deployment
naming another is refused by `driver_for`, as is a ``[jobs]`` key (an image, a Secret env) its
backend does not run (`JobKeys`). A trigger finds its driver on the triggerer by the same name
(`driver_type`) and rebuilds it from its JSON `args`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from rcpflow.recipe import Division
from rcpflow.verdict.schedule import DEFAULT_SCHEDULE
from tasks.deployment import (
    BACKEND_NAME,
    BackendName,
    Deployment,
    DeploymentError,
    EvalSchedule,
)
from tasks.executor_rule import refuse_distributed_executor
from tasks.jobs.command import Role

if TYPE_CHECKING:
    from tasks.backend_api.job_state import JobState
    from tasks.jobs.templates import EvaluateJob, TrainJob


@dataclass(frozen=True)
class FormDefaults:
    """Where the trigger forms start: values that work on this deployment's backend."""

    division: Division
    max_steps: int
    # The deployment's (`form_defaults` sets them): a run's Params may choose otherwise.
    eval_schedule: EvalSchedule = DEFAULT_SCHEDULE
    eval_window: int = 1


@dataclass(frozen=True)
class JobKeys:
    """What a backend makes of the ``[jobs.<role>]`` keys that only some backends run: True,
    it runs them; a string, the key of its own table's role that holds the same thing there
    (named in the refusal, e.g. Slurm's ``container_image``); False, nothing."""

    image: bool | str = False
    secret_env: bool | str = False


@dataclass(frozen=True)
class JobRequest:
    """One job a task asks its driver for: the job `label` (`lifecycle_names.TRAIN_LABEL`,
    ``eval-N``) of `role` in one DAG run on one run folder, its argument list and literal
    environment (the lifecycle's: the deployment's, the job's, the run's and the run owner;
    a driver adds its own Secret references), `extra` (a driver's own, e.g. Slurm's
    evaluation in the training's allocation), the deployment's bound on its running time
    (`timeout_s`, None: none; a driver that can bound it on its cluster does), and whether an
    earlier try of the task ran (`retry`: a driver may take the job that try left,
    `JobDriver.submit_or_adopt`)."""

    role: Role
    label: str
    dag_id: str
    run_id: str
    run_dir: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    retry: bool = False


@dataclass(frozen=True)
class Submitted:
    """A job a driver started or adopted: its reference (JSON: the task's record and the
    trigger's kwargs keep it), the watch's initial memo (a driver's own clocks, JSON), the
    line the task log says it with, and `ended`, the state of a job found ended already (a
    retry's: the task ends with it, nothing is watched)."""

    ref: Mapping[str, Any]
    memo: Mapping[str, Any] = field(default_factory=dict)
    line: str = ""
    ended: JobState | None = None


class JobDriver(Protocol):
    """One kind of job, driven (see the module doc). The worker calls `submit_or_adopt`,
    `restart`, `cancel` and `cancel_step`; the triggerer `read` (and `cancel` in a thread,
    after a stop request's grace); every call names the job by the reference the driver gave.
    A reference, a memo and `args` are JSON; nothing else of a driver crosses a process."""

    name: ClassVar[BackendName]
    # What the deployment's [jobs.<role>] image and secret_env keys are to this backend.
    job_keys: ClassVar[JobKeys]
    # The jobs run on the Airflow worker itself, so this machine is the system a submission
    # describes by default; otherwise the submission must name its system.
    jobs_run_on_worker: ClassVar[bool]
    # Where the trigger forms start on this backend, unless the deployment says otherwise.
    form_defaults: ClassVar[FormDefaults]
    # What the task log says failed to answer during an outage.
    cluster_word: ClassVar[str]
    # Its jobs can end within seconds of being watched (`watch_trigger.SETTLE_S`).
    quick_jobs: ClassVar[bool]

    # The watch's pace: seconds between reads, of failed reads before the task log says the
    # cluster is unreachable (the watch goes on), and the longest wait between failed reads.
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def outage_budget_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...

    # Airflow retries of a run task (an error of the task, not of its job: a retry adopts).
    @property
    def run_retries(self) -> int: ...

    # The job's ``{python}``.
    @property
    def python(self) -> str: ...

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> JobDriver:
        """The driver of a deployment that names this backend (its table's settings)."""
        ...

    def args(self) -> dict[str, Any]:
        """What rebuilds this driver on the triggerer (`from_args`), JSON, no secret."""
        ...

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> JobDriver:
        """The driver `args` gave (enough to read, cancel and cancel a step's job)."""
        ...

    def job_env(self, job: TrainJob | EvaluateJob) -> dict[str, str]:
        """The literal environment of a job of the deployment (its own ``env`` at least)."""
        ...

    def train_extra(self, values: Mapping[str, str | int]) -> dict[str, Any] | None:
        """What the training job of a run (`values`: `RunSpec.job_values`) needs beyond its
        argv and env (`JobRequest.extra`, JSON), None for nothing."""
        ...

    def max_restarts(self, role: Role) -> int:
        """How many counted restarts this driver submits for a job of `role` (0: none; a
        cluster that restarts jobs itself says so in the job's state)."""
        ...

    def defer_timeout(
        self, job_timeout: timedelta | None, memo: Mapping[str, Any]
    ) -> timedelta | None:
        """Airflow's deferral timeout of a watch (`memo`: its state now), the outer net behind
        the driver's own bounds: the job's `job_timeout` at least."""
        ...

    # --- on the worker ----------------------------------------------------------------------

    def planned_ref(self, request: JobRequest) -> Mapping[str, Any] | None:
        """The reference the job of `request` will have, where it is known before it is
        submitted (a JobSet's name): the task records it first, so that a worker lost between
        the submit and the record leaves no job its teardown cannot find. None: not known
        before (a Slurm job's id)."""
        ...

    def submit_or_adopt(self, request: JobRequest, log: Any) -> Submitted:
        """The job of `request`: the one an earlier try left running (adopted, only if it is
        this deployment's own), else one started now. Raise for a job that cannot start."""
        ...

    def restart(self, request: JobRequest, log: Any) -> Submitted:
        """Start the job of `request` again (its last run ended with a restart outcome)."""
        ...

    def waits_for(self, request: JobRequest, log: Any) -> Submitted | None:
        """A job that must end before the job of `request` starts (Slurm's training
        evaluating in its own allocation), None for none."""
        ...

    def cancel(self, ref: Mapping[str, Any]) -> bool:
        """Cancel the job of `ref` if it still runs; False when it had ended or is gone."""
        ...

    def cancel_step(self, dag_id: str, run_id: str, run_dir: str, step: int) -> bool:
        """Cancel the evaluation job of `step` in that DAG run if it still runs."""
        ...

    def describe(self, ref: Mapping[str, Any]) -> str:
        """The job of `ref` as every log line names it."""
        ...

    def output_tail(self, ref: Mapping[str, Any], state: JobState) -> str:
        """What a failed job's task error quotes after its line (its last output), or ""."""
        ...

    def remove(self, ref: Mapping[str, Any]) -> None:
        """Remove what an ended job left beside the cluster's own record (after the
        teardown), if anything."""
        ...

    # --- on the triggerer -------------------------------------------------------------------

    async def read(self, ref: Mapping[str, Any], memo: dict[str, Any], now: float) -> JobState:
        """The job's state (its new output lines with it). `memo` is the watch's own state,
        the driver's to update (the trigger persists it); `now` the watch's clock. Raise
        only when the cluster did not answer: a job that is gone, or that another object
        replaced, is an ended state."""
        ...


D = TypeVar("D", bound=type[JobDriver])
_DRIVERS: dict[BackendName, type[JobDriver]] = {}

# The module of each driver, by its name: a trigger's kwargs name the driver, and the
# triggerer imports its module by this table alone (never a path read from the kwargs). The
# names live in Airflow's database: tests/tasks/backend_api/test_lifecycle.py pins them.
DRIVER_MODULES: Mapping[BackendName, str] = {
    "local": "tasks.backends.local.driver",
    "slurm": "tasks.backends.slurm.driver",
    "gke": "tasks.backends.gke.driver",
}


def register(cls: D) -> D:
    """Class decorator of a driver: `driver_for` and `driver_type` find it by its `name`."""
    if not BACKEND_NAME.fullmatch(cls.name):
        raise ValueError(f"backend {cls.name!r} is not a backend name ({BACKEND_NAME.pattern})")
    if _DRIVERS.setdefault(cls.name, cls) is not cls:
        raise ValueError(f"backend {cls.name!r} is already registered ({_DRIVERS[cls.name]})")
    return cls


def registered() -> dict[BackendName, type[JobDriver]]:
    """The drivers registered so far, by name."""
    return dict(_DRIVERS)


def driver_type(name: str) -> type[JobDriver]:
    """The driver registered as `name`, its module (`DRIVER_MODULES`) imported first if need
    be; LookupError for any other name."""
    if name not in _DRIVERS and name in DRIVER_MODULES:
        importlib.import_module(DRIVER_MODULES[name])
    try:
        return _DRIVERS[name]
    except KeyError:
        raise LookupError(
            f"backend {name!r} is not registered (import tasks.backends.registry)"
        ) from None


def _chosen(deployment: Deployment) -> type[JobDriver]:
    """The driver class the deployment names; a name nobody registered is the deployment's
    error, naming its file and key."""
    found = _DRIVERS.get(deployment.backend)
    if found is None:
        raise DeploymentError(
            f"{deployment.source}: backend: {deployment.backend!r} is not a registered backend "
            f"({', '.join(sorted(_DRIVERS)) or 'none registered'})"
        )
    return found


def _check_job_keys(deployment: Deployment, cls: type[JobDriver]) -> None:
    """Refuse a ``[jobs]`` image or secret_env that the chosen backend does not run, naming the
    backends that do and where the chosen one takes it instead."""
    name = deployment.backend
    for keys, attr, what in (
        (deployment.jobs.images(), "image", "runs images"),
        (deployment.jobs.secret_envs(), "secret_env", "takes Secret envs"),
    ):
        taken: bool | str = getattr(cls.job_keys, attr)
        for key in keys:
            if taken is True:
                continue
            takers = sorted(n for n, c in _DRIVERS.items() if getattr(c.job_keys, attr) is True)
            role = key.split(".")[0]
            hint = f"; on {name} give {name}.{role}.{taken}" if taken else ""
            raise DeploymentError(
                f"{deployment.source}: jobs.{key}: only the {' or '.join(takers) or 'no'} "
                f"backend {what} (backend is {name!r}){hint}"
            )


def form_defaults(deployment: Deployment) -> FormDefaults:
    """The trigger forms' defaults: the deployment's ``[form_defaults]``, else its backend's;
    the evaluation schedule and window are the deployment's own keys."""
    base = _chosen(deployment).form_defaults
    overrides = deployment.form_defaults
    return FormDefaults(
        division=(overrides.division if overrides else None) or base.division,
        max_steps=(overrides.max_steps if overrides else None) or base.max_steps,
        eval_schedule=deployment.eval_schedule,
        eval_window=deployment.eval_window,
    )


def driver_for(deployment: Deployment) -> JobDriver:
    """The driver the deployment names, built from its settings, once its ``[jobs]`` keys are
    ones that backend runs and, for one whose jobs run on the worker, Airflow's executor keeps
    a run's tasks on one host (`tasks.executor_rule`)."""
    cls = _chosen(deployment)
    _check_job_keys(deployment, cls)
    if cls.jobs_run_on_worker:
        refuse_distributed_executor(deployment)
    return cls.from_deployment(deployment)
