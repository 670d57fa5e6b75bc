"""When a run's checkpoints are evaluated: the deployment's ``eval_schedule``, one wiring each.

``after_training`` (the default): the ``evaluation`` group maps over the manifest's rows once
training has ended. ``during_training``: it maps over the planned steps and starts with
training (`tasks.run.during`). Either way the gate, the summaries and the MLLOG are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from airflow.sdk import TaskGroup, XComArg

from tasks.run.during import during_training_group
from tasks.run.evaluation import evaluation_group
from tasks.run.spec import run_dir_of

if TYPE_CHECKING:
    from tasks.backends.base import Backend
    from tasks.deployment import Deployment, EvalSchedule

Wiring = Callable[["Backend", "Deployment", XComArg, TaskGroup], TaskGroup]


def after_training(
    backend: Backend, deployment: Deployment, spec: XComArg, train: TaskGroup
) -> TaskGroup:
    group = evaluation_group(backend, run_dir_of(spec))
    train >> group
    return group


SCHEDULES: Mapping[EvalSchedule, Wiring] = {
    "after_training": after_training,
    "during_training": during_training_group,
}


def evaluation_for(
    backend: Backend, deployment: Deployment, spec: XComArg, train: TaskGroup
) -> TaskGroup:
    """The ``evaluation`` group of the deployment's schedule, wired to `train`."""
    return SCHEDULES[deployment.eval_schedule](backend, deployment, spec, train)
