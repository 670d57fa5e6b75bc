"""What a backend is (`Backend`), and the registry of backends by name.

A backend builds the nodes that run jobs: the training job of a run and the mapped evaluation
of its checkpoints; the group factories of `tasks.run` never ask which one they were given.
Each backend module registers its class here (`register`); this module imports none of them.
Code that needs a backend by name imports `tasks.backends.registry`, which imports them all.
The backend names are the registry's: a deployment naming another is refused by `backend_for`,
as is a ``[jobs]`` key (an image, a Secret env) its backend does not run (`JobKeys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

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

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin


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


class Backend(Protocol):
    name: ClassVar[BackendName]
    # What the deployment's [jobs.<role>] image and secret_env keys are to this backend.
    job_keys: ClassVar[JobKeys]
    # The jobs run on the Airflow worker itself, so this machine is the system a submission
    # describes by default; otherwise the submission must name its system.
    jobs_run_on_worker: ClassVar[bool]
    # Where the trigger forms start on this backend, unless the deployment says otherwise.
    form_defaults: ClassVar[FormDefaults]

    def __init__(self, deployment: Deployment) -> None: ...

    def train_job(self, spec: XComArg) -> DependencyMixin:
        """The node(s) that run the training job for the RunSpec dict `spec` resolves to; what
        is returned is what the output check waits for."""
        ...

    def evaluate(self, run_dir: str | XComArg, rows: XComArg) -> DependencyMixin:
        """Task ``evaluate`` mapped over the manifest rows that `rows` resolves to, one
        instance per checkpoint labelled ``step N``, each behind the steps of
        `tasks.run.stages` (plus any teardown it needs); what finalize waits for."""
        ...

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        """Task ``evaluate`` of the checkpoint of `step` (its row read from the manifest),
        inside the run DAG's mapped task group ``checkpoint`` (one per planned step), behind
        the same steps; the step's ``wait`` holds it back to the run's eval window (a Param),
        so its own limit is only a ceiling (`tasks.deployment.MAX_EVAL_WINDOW`); what the
        step's ``after_evaluation`` waits for."""
        ...


B = TypeVar("B", bound=type[Backend])
_BACKENDS: dict[BackendName, type[Backend]] = {}


def register(cls: B) -> B:
    """Class decorator of a backend: `backend_for` finds it by its `name`."""
    if not BACKEND_NAME.fullmatch(cls.name):
        raise ValueError(f"backend {cls.name!r} is not a backend name ({BACKEND_NAME.pattern})")
    if _BACKENDS.setdefault(cls.name, cls) is not cls:
        raise ValueError(f"backend {cls.name!r} is already registered ({_BACKENDS[cls.name]})")
    return cls


def registered() -> dict[BackendName, type[Backend]]:
    """The backends registered so far, by name."""
    return dict(_BACKENDS)


def backend_type(name: BackendName) -> type[Backend]:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise LookupError(
            f"backend {name!r} is not registered (import tasks.backends.registry)"
        ) from None


def _chosen(deployment: Deployment) -> type[Backend]:
    """The class of the backend the deployment names; a name nobody registered is the
    deployment's error, naming its file and key."""
    found = _BACKENDS.get(deployment.backend)
    if found is None:
        raise DeploymentError(
            f"{deployment.source}: backend: {deployment.backend!r} is not a registered backend "
            f"({', '.join(sorted(_BACKENDS)) or 'none registered'})"
        )
    return found


def _check_job_keys(deployment: Deployment, cls: type[Backend]) -> None:
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
            takers = sorted(n for n, c in _BACKENDS.items() if getattr(c.job_keys, attr) is True)
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


def backend_for(deployment: Deployment) -> Backend:
    """The backend the deployment names, built from its settings, once its ``[jobs]`` keys are
    ones that backend runs and, for one whose jobs run on the worker, Airflow's executor keeps
    a run's tasks on one host (`tasks.executor_rule`)."""
    cls = _chosen(deployment)
    _check_job_keys(deployment, cls)
    if cls.jobs_run_on_worker:
        refuse_distributed_executor(deployment)
    return cls(deployment)
