"""What a backend is, and which one a deployment gets.

A backend builds the nodes that run jobs: the training job of a run and the mapped evaluation
of its checkpoints. It is chosen once, at parse time, from the deployment's ``backend`` and
handed to the group factories of `tasks.run`, which never ask which backend they were given.
A new backend is a class with this shape, registered in `BACKENDS` under a name that
`tasks.deployment.BackendName` lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, Protocol

from tasks.backends.gke.backend import GkeBackend
from tasks.backends.local import LocalBackend
from tasks.deployment import BackendName, Deployment
from tasks.run.spec import FormDefaults

if TYPE_CHECKING:
    from airflow.sdk import XComArg
    from airflow.sdk.definitions._internal.mixins import DependencyMixin


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
        instance per checkpoint labelled ``step N``, each behind the gate of `tasks.run.gate`
        (plus any teardown it needs); what is returned is what finalize waits for."""
        ...

    def evaluate_checkpoint(self, run_dir: str | XComArg, step: int | XComArg) -> DependencyMixin:
        """Task ``evaluate`` of the checkpoint of `step` (its row read from the manifest),
        inside the mapped task group of evaluation during training (one instance per planned
        step), behind the same gate and with the same eval window; what is returned is what
        the step's stop check waits for."""
        ...


BACKENDS: Mapping[BackendName, type[Backend]] = {"local": LocalBackend, "gke": GkeBackend}


def backend_type(name: BackendName) -> type[Backend]:
    return BACKENDS[name]


def form_defaults(deployment: Deployment) -> FormDefaults:
    """The trigger forms' defaults: the deployment's ``[form_defaults]``, else its backend's."""
    base = BACKENDS[deployment.backend].form_defaults
    overrides = deployment.form_defaults
    if overrides is None:
        return base
    return FormDefaults(
        division=overrides.division or base.division,
        max_steps=overrides.max_steps or base.max_steps,
    )


def backend_for(deployment: Deployment) -> Backend:
    """The backend the deployment names, built from its settings."""
    return BACKENDS[deployment.backend](deployment)
