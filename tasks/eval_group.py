"""The ``evaluation`` TaskGroup, shared by the run DAG and the deferred-eval DAG.

``load_manifest`` -> ``evaluate`` mapped over the manifest rows (labelled ``step N``) ->
``finalize`` -> ``check``.

Short-circuit: an ``evaluate`` instance decides from the summaries on storage (`rcpflow.gate`),
never from which instance ran before it, because instances run in any order (``dag.test()``
shuffles them, a retried instance runs after later ones, an eval window > 1 runs several at
once). If a lower step's valid summary already passes, the instance skips, saying which step
passed. When an instance passes it also marks the later map indexes skipped
(``DownstreamTasksSkipped``) so the scheduler does not start them; that only saves time, the
gate alone is what makes the result right. A valid summary is reused, never recomputed, so a
run whose summaries already decide it launches no evaluation job.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, TriggerRule, XComArg, get_current_context, task, task_group

from rcpflow.manifest import ManifestRow
from tasks.deployment import Deployment

log = logging.getLogger(__name__)


class EvaluationError(RuntimeError):
    """An evaluation job finished without leaving a valid summary; the message says why."""


def load_rows(run_dir: str) -> list[dict[str, Any]]:
    """The manifest's rows (validated, stale ones dropped) as JSON-able dicts, by step."""
    from rcpflow.layout import RunLayout
    from rcpflow.manifest import load

    manifest = load(RunLayout(run_dir).manifest)
    for warning in manifest.warnings:
        log.warning("manifest: %s", warning)
    if not manifest.rows:
        raise EvaluationError(f"{manifest.path}: no checkpoint rows to evaluate")
    log.info(
        "%d checkpoints to consider: steps %d..%d",
        len(manifest.rows),
        manifest.rows[0].step,
        manifest.rows[-1].step,
    )
    return [_row_dict(r) for r in manifest.rows]


def _row_dict(row: ManifestRow) -> dict[str, Any]:
    return dataclasses.asdict(row)


def finalize_run(run_dir: str) -> dict[str, Any]:
    """`rcpflow.finalize`, refusing to end green without a run_stop."""
    from rcpflow.finalize import FinalizeInputError, finalize

    try:
        result = finalize(run_dir)
    except FinalizeInputError as exc:
        raise EvaluationError(f"finalize refused {run_dir} (log untouched): {exc}") from exc
    for warning in result.warnings:
        log.warning("finalize: %s", warning)
    if result.status == "incomplete":
        raise EvaluationError(
            f"run {run_dir} is incomplete, no run_stop was written: {result.reason}"
        )
    log.info("finalize: %s (%s); MLLOG %s", result.status, result.reason, result.log_path)
    return {**result.verdict(), "reason": result.reason, "log_path": result.log_path}


def log_division(log_path: str) -> str:
    """The division the MLLOG declares (what the trainer was asked to run)."""
    from rcpflow.mllog import read_events

    declared = [e.value for e in read_events(log_path) if e.key == "submission_division"]
    if len(declared) != 1:
        raise EvaluationError(
            f"{log_path}: expected one submission_division event, found {len(declared)}"
        )
    return str(declared[0])


def check_run(run_dir: str) -> dict[str, Any]:
    """The official compliance checker on the run's MLLOG, for the division it declares."""
    from rcpflow.checkers import compliance
    from rcpflow.layout import RunLayout
    from rcpflow.manifest import load
    from tasks.verdicts import record, tool_log_dir

    layout = RunLayout(run_dir)
    log_path = load(layout.manifest).rows[0].mllog_file
    division = log_division(log_path)
    result = compliance(log_path, division=division, log_dir=tool_log_dir(layout.root))
    verdict = record(result, subject=log_path, folder=layout.root)
    for line in result.output.splitlines()[-20:]:
        log.info("compliance_checker | %s", line)
    if not verdict.ok:
        raise EvaluationError(
            f"compliance checker ({division}) rejects {log_path}:\n  " + "\n  ".join(verdict.errors)
        )
    log.info("compliance checker (%s division): %s passes", division, log_path)
    return {"division": division, "log_path": log_path, "ok": True}


@dataclass(frozen=True)
class EvalTarget:
    """One checkpoint to evaluate, with the run's current manifest rows (for the gate)."""

    run_dir: str
    row: ManifestRow
    rows: tuple[ManifestRow, ...]

    @property
    def step(self) -> int:
        return self.row.step


def eval_target(run_dir: str, row: dict[str, Any]) -> EvalTarget:
    """Re-read the manifest rather than trust the XCom copy: the gate must see the run as it
    is now, and a row that changed since load_manifest is an error, not something to guess."""
    from rcpflow.layout import RunLayout
    from rcpflow.manifest import ManifestError, load

    step = row["step"]
    manifest = load(RunLayout(run_dir).manifest)
    try:
        current = manifest.row(step)
    except ManifestError as exc:
        raise EvaluationError(f"step {step}: no longer in the manifest: {exc}") from exc
    if _row_dict(current) != row:
        raise EvaluationError(f"step {step}: manifest row changed since load_manifest; re-run")
    return EvalTarget(run_dir=run_dir, row=current, rows=manifest.rows)


def skip_if_decided(target: EvalTarget) -> None:
    """AirflowSkipException when a lower step's valid summary already passes the target."""
    from airflow.sdk.exceptions import AirflowSkipException

    from rcpflow.gate import passing_step_below

    passed = passing_step_below(target.run_dir, target.step, target.rows)
    if passed is not None:
        raise AirflowSkipException(
            f"step {passed} already passed the target; step {target.step} is not evaluated"
        )


def reusable(target: EvalTarget) -> bool:
    from rcpflow.gate import valid_summary
    from rcpflow.layout import RunLayout

    if valid_summary(target.run_dir, target.row) is None:
        return False
    log.info(
        "step %d: reusing the valid summary at %s",
        target.step,
        RunLayout(target.run_dir).summary(target.step),
    )
    return True


def collect(target: EvalTarget) -> dict[str, Any]:
    """Read and validate the step's summary; when it passes, mark later map indexes skipped
    (DownstreamTasksSkipped: this instance still ends as success)."""
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from rcpflow.gate import passes
    from rcpflow.layout import RunLayout
    from rcpflow.summary import SummaryError, read_summary, summary_problems

    step = target.step
    path = RunLayout(target.run_dir).summary(step)
    try:
        summary = read_summary(path)
    except FileNotFoundError as exc:
        raise EvaluationError(f"step {step}: the job wrote no summary at {path}") from exc
    except SummaryError as exc:
        raise EvaluationError(f"step {step}: unreadable summary: {exc}") from exc
    problems = summary_problems(summary, target.row)
    if problems:
        raise EvaluationError(f"step {step}: summary {path} is not valid: " + "; ".join(problems))
    reached = passes(summary, target.row)
    log.info(
        "step %d: eval_accuracy (pass@4) %.4f %s target %s",
        step,
        summary.eval_accuracy,
        ">" if reached else "<=",
        target.row.target_accuracy,
    )
    if reached:
        ti = get_current_context()["ti"]
        later = [
            (ti.task_id, index)
            for index, r in enumerate(target.rows)
            if r.step > step and index > ti.map_index
        ]
        if later:
            log.info("step %d passed: marking %d later checkpoint(s) skipped", step, len(later))
            raise DownstreamTasksSkipped(tasks=later)
    return {"step": step, "eval_accuracy": summary.eval_accuracy, "target_reached": reached}


def evaluate_row(
    run_dir: str, row: dict[str, Any], launch: Callable[[str, int], None]
) -> dict[str, Any]:
    """Evaluate one checkpoint unless the gate says a lower step already passed.

    `launch(run_dir, step)` runs the evaluation job and raises if it fails.
    """
    target = eval_target(run_dir, row)
    skip_if_decided(target)
    if not reusable(target):
        try:
            launch(run_dir, target.step)
        except Exception:
            # With an eval window > 1 a lower step may have passed while this job ran: then
            # this failure does not matter to the run.
            skip_if_decided(target)
            raise
    return collect(target)


def local_launch(deployment: Deployment) -> Callable[[str, int], None]:
    def launch(run_dir: str, step: int) -> None:
        from tasks.local_jobs import EVALUATE_MODULE, evaluate_args, module_command, run_job

        argv = module_command(
            deployment.job_python, EVALUATE_MODULE, evaluate_args(run_dir=run_dir, step=step)
        )
        run_job(argv, name=f"evaluate step {step}", env=deployment.job_env)

    return launch


def eval_group(deployment: Deployment, run_dir: str | XComArg) -> TaskGroup:
    """TaskGroup ``evaluation`` over the run at `run_dir` (a value, template or XComArg)."""

    @task
    def load_manifest(run_dir: str) -> list[dict[str, Any]]:
        return load_rows(run_dir)

    @task(
        map_index_template="step {{ eval_step }}",
        max_active_tis_per_dagrun=deployment.eval_window,
        retries=deployment.eval_retries,
        execution_timeout=timedelta(minutes=deployment.eval_timeout_minutes),
    )
    def evaluate(run_dir: str, row: dict[str, Any]) -> dict[str, Any]:
        get_current_context()["eval_step"] = row["step"]  # type: ignore[typeddict-unknown-key]
        return evaluate_row(run_dir, row, local_launch(deployment))

    # A skipped evaluate (decided by a lower step) must not stop finalize; a failed one must.
    @task(trigger_rule=TriggerRule.NONE_FAILED)
    def finalize(run_dir: str) -> dict[str, Any]:
        return finalize_run(run_dir)

    @task
    def check(run_dir: str) -> dict[str, Any]:
        return check_run(run_dir)

    @task_group(group_id="evaluation")
    def evaluation(run_dir: str) -> None:
        rows = load_manifest(run_dir)
        if deployment.backend == "gke":
            from tasks.gke_wiring import gke_evaluate

            evaluated, _cleanup = gke_evaluate(deployment, run_dir, rows)
        else:
            evaluated = evaluate.partial(run_dir=run_dir).expand(row=rows)
        evaluated >> finalize(run_dir) >> check(run_dir)

    return evaluation(run_dir)


@task
def existing_run() -> str:
    """First task of a deferred evaluation: the run_dir Param, checked to hold a manifest."""
    from rcpflow.layout import RunLayout
    from rcpflow.storage import storage_for
    from tasks.run_spec import check_path

    run_dir = check_path("run_dir", get_current_context()["params"]["run_dir"])
    manifest = RunLayout(run_dir).manifest
    if not storage_for(manifest).exists(manifest):
        raise EvaluationError(
            f"run_dir: {run_dir} has no manifest at {manifest}; nothing to evaluate"
        )
    return run_dir
