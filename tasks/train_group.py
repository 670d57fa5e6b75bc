"""The ``train`` TaskGroup: run one seed's training job on the backend, then check its outputs.

Local backend: ``train_job`` runs ``python -m tpu_jobs.train`` as a subprocess of the worker
and waits for it (launch and wait are one blocking task: a local child cannot outlive the task
that started it), then ``check_outputs``. GKE backend: the JobSet group of `tasks.gke`
(create -> wait, deferred -> delete as a teardown), then the same ``check_outputs``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, XComArg, task, task_group

from tasks.deployment import Deployment
from tasks.run_spec import RunSpec

log = logging.getLogger(__name__)


class TrainingOutputError(RuntimeError):
    """The training job exited 0 but its outputs are not a usable run; names what is wrong."""


def check_training_outputs(spec: RunSpec) -> dict[str, Any]:
    """The manifest is valid and covers val_start_at..max_steps; the MLLOG is a training section."""
    from rcpflow.layout import RunLayout
    from rcpflow.manifest import ManifestError, load
    from rcpflow.mllog import EVAL_SECTION_KEYS, read_events, run_start_ms

    layout = RunLayout(spec.run_dir)
    try:
        manifest = load(layout.manifest)
    except ManifestError as exc:
        raise TrainingOutputError(f"manifest: {exc}") from exc
    for warning in manifest.warnings:
        log.warning("manifest: %s", warning)
    if not manifest.rows:
        raise TrainingOutputError(f"{layout.manifest}: no checkpoint rows after training")
    first, last = manifest.rows[0], manifest.rows[-1]
    expected = {
        "seed": spec.seed,
        "global_batch_size": spec.global_batch_size,
        "max_steps": spec.max_steps,
        "val_start_at": spec.effective_val_start_at,
    }
    for name, value in expected.items():
        if getattr(first, name) != value:
            raise TrainingOutputError(
                f"{layout.manifest}: step {first.step}: {name} is {getattr(first, name)!r}, "
                f"the run asked for {value!r}"
            )
    if last.step != spec.max_steps:
        raise TrainingOutputError(
            f"{layout.manifest}: last checkpoint is step {last.step}, training should have "
            f"saved every step up to max_steps {spec.max_steps}"
        )
    log_path = layout.mllog(spec.seed)
    if first.mllog_file != log_path:
        raise TrainingOutputError(
            f"{layout.manifest}: rows name MLLOG {first.mllog_file}, expected {log_path}"
        )
    try:
        events = read_events(log_path)
    except FileNotFoundError as exc:
        raise TrainingOutputError(f"{log_path}: no MLLOG after training") from exc
    if run_start_ms(events) is None:
        raise TrainingOutputError(f"{log_path}: no run_start")
    eval_keys = sorted({e.key for e in events} & EVAL_SECTION_KEYS)
    if eval_keys:
        # finalize writes these after evaluation; a fresh training log must not have them
        raise TrainingOutputError(f"{log_path}: training log already has {', '.join(eval_keys)}")
    log.info(
        "training outputs ok: %d checkpoints, steps %d..%d, MLLOG %s",
        len(manifest.rows),
        first.step,
        last.step,
        log_path,
    )
    return {"checkpoints": len(manifest.rows), "first_step": first.step, "last_step": last.step}


def train_group(deployment: Deployment, spec: XComArg) -> TaskGroup:
    """TaskGroup ``train`` for the RunSpec dict that `spec` resolves to."""

    @task
    def check_outputs(spec: dict[str, Any]) -> dict[str, Any]:
        return check_training_outputs(RunSpec(**spec))

    if deployment.backend == "gke":
        from tasks.gke_wiring import gke_train_group

        @task_group(group_id="train")
        def train_gke(spec: XComArg) -> None:
            gke_train_group(deployment, spec) >> check_outputs(spec)

        return train_gke(spec)

    @task(execution_timeout=timedelta(minutes=deployment.train_timeout_minutes))
    def train_job(spec: dict[str, Any]) -> None:
        from tasks.local_jobs import TRAIN_MODULE, module_command, run_job

        run = RunSpec(**spec)
        argv = module_command(deployment.job_python, TRAIN_MODULE, run.train_args())
        run_job(argv, name=f"train seed {run.seed}", env=deployment.job_env)

    @task_group(group_id="train")
    def train_local(spec: XComArg) -> None:
        train_job(spec) >> check_outputs(spec)

    return train_local(spec)
