"""What a backend is (`Backend`), and the registry of backends by name.

A backend builds the nodes that run jobs: the training job of a run and the mapped evaluation
of its checkpoints; the group factories of `tasks.run` never ask which one they were given.
Each backend module registers its class here (`register`); this module imports none of them.
Code that needs a backend by name imports `tasks.backends.registry`, which imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

from rcpflow.recipe import Division
from rcpflow.verdict.schedule import DEFAULT_SCHEDULE
from tasks.deployment import BACKEND_NAMES, BackendName, Deployment, EvalSchedule

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


class Backend(Protocol):
    name: ClassVar[BackendName]
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

    def cancel_evaluation(self, run_dir: str, step: int) -> bool:
        """Stop the evaluation job of `step` of the run in `run_dir` if one is running (called
        from a task of the same DAG run once a lower step passed); True when one was stopped.
        The job's task then ends skipped, naming the step that passed."""
        ...


B = TypeVar("B", bound=type[Backend])
_BACKENDS: dict[BackendName, type[Backend]] = {}


def register(cls: B) -> B:
    """Class decorator of a backend: `backend_for` finds it by its `name`."""
    if cls.name not in BACKEND_NAMES:
        raise ValueError(f"backend {cls.name!r} is not a BackendName ({', '.join(BACKEND_NAMES)})")
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


def form_defaults(deployment: Deployment) -> FormDefaults:
    """The trigger forms' defaults: the deployment's ``[form_defaults]``, else its backend's;
    the evaluation schedule and window are the deployment's own keys."""
    base = backend_type(deployment.backend).form_defaults
    overrides = deployment.form_defaults
    return FormDefaults(
        division=(overrides.division if overrides else None) or base.division,
        max_steps=(overrides.max_steps if overrides else None) or base.max_steps,
        eval_schedule=deployment.eval_schedule,
        eval_window=deployment.eval_window,
    )


def backend_for(deployment: Deployment) -> Backend:
    """The backend the deployment names, built from its settings."""
    return backend_type(deployment.backend)(deployment)
