"""The evaluate operator on GKE (`tasks.backends.gke.evaluate_operators`) against the stand-in
API server: a pass deletes the evaluation JobSets of the higher steps that still run, never one
at or below it nor one that has finished, and the task of a deleted JobSet skips naming the
pass (the same rule the Slurm backend applies with scancel)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_task import FakeTI

from tasks.backends.gke.render import jobset_name
from tasks.backends.gke.settings import GkeSettings
from tasks.jobs.templates import EvaluateJob
from tasks.run.evaluate_operator import eval_label
from tasks.run.stages import load_rows

DAG_ID, RUN_ID = "mlperf_grpo_run", "manual__cancel"


def _event(phase: str, reason: str = "") -> dict[str, Any]:
    """What JobSetTrigger yields for a JobSet in `phase`."""
    return {"name": "n", "namespace": "default", "phase": phase, "progress": "1/1",
            "reason": reason, "message": reason, "pods": [], "kwargs": None}  # fmt: skip


def test_a_pass_deletes_only_the_higher_steps_running_evaluation_jobsets(
    fake_gke: Any, recorded_status: Any, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

    from devtools.synthetic_run import make_run, write_eval
    from tasks.backends.gke.evaluate_operators import EvaluateJobSetOperator

    run = make_run(str(tmp_path / "run"), last_step=22)  # rows 18..22, no summaries
    settings = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
    job = EvaluateJob(command=("{python}", "-c", "pass"))
    name = {s: jobset_name(DAG_ID, RUN_ID, eval_label(s)) for s in range(18, 23)}
    # step 21's JobSet has already finished: nothing to stop there
    fake_gke.scripts[name[21]] = [recorded_status("status_succeeded.json")["status"]]
    rows = {r["step"]: r for r in load_rows(run.run_dir)}
    ops, contexts = {}, {}
    for step in (18, 19, 20, 21):
        ops[step] = EvaluateJobSetOperator(
            task_id="evaluation.evaluate", settings=settings, eval_job=job, run_dir=run.run_dir,
            row=rows[step],
        )  # fmt: skip
        ti = FakeTI(task_id="evaluation.evaluate", map_index=step - 18)
        contexts[step] = {"ti": ti, "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID)}
        with pytest.raises(TaskDeferred):
            ops[step].execute(contexts[step])
    assert {key[1] for key in fake_gke.objects} == {name[s] for s in (18, 19, 20, 21)}

    write_eval(run, 19, 0.8)  # what step 19's pods wrote: a pass
    passed = ops[19].execute_complete(contexts[19], _event("Succeeded"))
    assert passed["step"] == 19 and passed["target_reached"] is True
    assert fake_gke.deleted == [name[20]]  # not 18 (below), not 21 (finished), not 22 (none)

    # step 20's trigger then sees its JobSet gone: the task skips, naming the pass
    with pytest.raises(
        AirflowSkipException, match="step 20: skipped, its evaluation was stopped: step 19"
    ):
        ops[20].execute_complete(contexts[20], _event("Failed", reason="NotFound"))
