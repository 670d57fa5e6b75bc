"""How a cluster backend's evaluate operator takes a foreign evaluate job's result in
(`tasks.jobs.result`): right before the job starts, the wall clock and what is at its result
path go into an XCom (`record_eval_start`), since the deferred task resumes in another
process; once the job succeeded, `import_eval_result` imports what it added, with the time
from then to now as its eval times."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.jobs.result import Baseline, EvaluationError, baseline, import_result, now_ms

if TYPE_CHECKING:
    from airflow.sdk import Context

    from rcpflow.verdict.eval_import import ImportResult
    from tasks.jobs.templates import EvaluateJob
    from tasks.jobs.values import Values

# XCom key of a foreign evaluate job's start: its wall clock and what was at its result path.
EVAL_START_XCOM_KEY = "eval_start"


def record_eval_start(context: Context, job: EvaluateJob, values: Values) -> None:
    """The start of the job of `values` (`evaluate_values`): now, and its `baseline`."""
    before = baseline(job.result, values)
    context["ti"].xcom_push(
        key=EVAL_START_XCOM_KEY, value={"ms": now_ms(), "baseline": before.to_dict()}
    )


def import_eval_result(
    context: Context, job: EvaluateJob, values: Values, started: str
) -> ImportResult:
    """The result of the job of `values` that just succeeded, from its recorded start to now;
    `started` says how the job started (``the job was submitted``), for the error when this
    task recorded no start."""
    ti = context["ti"]
    start = ti.xcom_pull(task_ids=ti.task_id, key=EVAL_START_XCOM_KEY, map_indexes=ti.map_index)
    if start is None:
        raise EvaluationError(
            f"step {values['step']}: no {EVAL_START_XCOM_KEY} recorded before {started}: its "
            "eval times are unknown; clear the task to evaluate again"
        )
    return import_result(
        job.result, values, Baseline.from_dict(start["baseline"]), (start["ms"], now_ms())
    )
