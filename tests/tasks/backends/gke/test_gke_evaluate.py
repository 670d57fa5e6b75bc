"""The evaluate operator (`tasks.run.evaluate_operator.EvaluateOperator`) on the GKE driver
against the stand-in API server: a pass deletes the evaluation JobSets of the higher steps that
still run, never one at or below it nor one that has finished (`GkeDriver.cancel_step`, on the
worker and, rebuilt from its args, on the triggerer), and the task of a deleted JobSet skips
naming the pass (the same rule the Slurm backend applies with scancel)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_task import FakeTI

from tasks.backend_api.job_state import JobState
from tasks.backend_api.lifecycle_names import ENDED
from tasks.backends.gke.driver import GkeDriver
from tasks.backends.gke.render import jobset_name
from tasks.backends.gke.settings import GkeSettings
from tasks.jobs.templates import EvaluateJob
from tasks.run.evaluate_operator import eval_label
from tasks.run.stages import load_rows

DAG_ID, RUN_ID = "mlperf_grpo_run", "manual__cancel"


def _event(ref: dict[str, Any], state: JobState) -> dict[str, Any]:
    """What the watch of the JobSet `ref` yields once it ended in `state`."""
    return {"phase": ENDED, "reason": "", "message": "", "ref": ref, "state": state.as_json(),
            "budget": {}, "kwargs": None}  # fmt: skip


def test_a_pass_deletes_only_the_higher_steps_running_evaluation_jobsets(
    fake_gke: Any, recorded_status: Any, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

    from devtools.synthetic_run import make_run, write_eval
    from tasks.run.evaluate_operator import EvaluateOperator

    run = make_run(str(tmp_path / "run"), last_step=22)  # rows 18..22, no summaries
    settings = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
    job = EvaluateJob(command=("{python}", "-c", "pass"))
    name = {s: jobset_name(DAG_ID, RUN_ID, eval_label(s)) for s in range(18, 23)}
    # step 21's JobSet has already finished: nothing to stop there
    fake_gke.scripts[name[21]] = [recorded_status("status_succeeded.json")["status"]]
    rows = {r["step"]: r for r in load_rows(run.run_dir)}
    ops, contexts = {}, {}
    for step in (18, 19, 20, 21):
        ops[step] = EvaluateOperator(
            task_id="evaluation.evaluate", driver=GkeDriver(settings), eval_job=job,
            run_dir=run.run_dir, row=rows[step],
        )  # fmt: skip
        ti = FakeTI(task_id="evaluation.evaluate", map_index=step - 18)
        contexts[step] = {"ti": ti, "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID)}
        with pytest.raises(TaskDeferred):
            ops[step].execute(contexts[step])
    assert {key[1] for key in fake_gke.objects} == {name[s] for s in (18, 19, 20, 21)}

    write_eval(run, 19, 0.8)  # what step 19's pods wrote: a pass
    ref = {s: {"name": name[s], "namespace": "default"} for s in name}
    succeeded = JobState("succeeded [1/1]", "succeeded")
    passed = ops[19].execute_complete(contexts[19], _event(ref[19], succeeded))
    assert passed["step"] == 19 and passed["target_reached"] is True
    assert fake_gke.deleted == [name[20]]  # not 18 (below), not 21 (finished), not 22 (none)

    # step 20's trigger then sees its JobSet gone: the task skips, naming the pass
    with pytest.raises(
        AirflowSkipException, match="step 20: skipped, its evaluation was stopped: step 19"
    ):
        gone = JobState("is gone: not found", "fail_now", reason="NotFound")
        ops[20].execute_complete(contexts[20], _event(ref[20], gone))
    assert contexts[20]["ti"].pushed["cluster_job"]["cancel"] is True


def test_a_pass_on_the_triggerer_deletes_through_the_driver_rebuilt_from_its_args(
    fake_gke: Any, recorded_status: Any, tmp_path: Path
) -> None:
    """The evaluation's end on the triggerer (`tasks.run.evaluation_end`): the trigger's kwargs
    name the driver and its args, and a pass there stops a higher step's running JobSet the
    same way, never one that has finished."""
    from airflow.sdk.exceptions import TaskDeferred

    from devtools.synthetic_run import make_run, write_eval
    from tasks.backend_api.task_end import JobOutcome, end_task
    from tasks.run.evaluate_operator import EvaluateOperator

    run = make_run(str(tmp_path / "run"), last_step=21)
    settings = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01, namespace="default")
    job = EvaluateJob(command=("{python}", "-c", "pass"))
    name = {s: jobset_name(DAG_ID, RUN_ID, eval_label(s)) for s in range(18, 22)}
    fake_gke.scripts[name[21]] = [recorded_status("status_succeeded.json")["status"]]
    rows = {r["step"]: r for r in load_rows(run.run_dir)}
    triggers = {}
    for step in (18, 20, 21):
        op = EvaluateOperator(
            task_id="evaluation.evaluate", driver=GkeDriver(settings), eval_job=job,
            run_dir=run.run_dir, row=rows[step],
        )  # fmt: skip
        ti = FakeTI(task_id="evaluation.evaluate", map_index=step - 18)
        context = {"ti": ti, "dag_run": SimpleNamespace(dag_id=DAG_ID, run_id=RUN_ID)}
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context)
        triggers[step] = deferred.value.trigger
    spec = triggers[18].task_end
    assert spec["name"] == "evaluation"
    assert spec["args"]["cancel"] == {
        "driver": "gke", "args": GkeDriver(settings).args(), "dag_id": DAG_ID, "run_id": RUN_ID,
    }  # fmt: skip

    from tasks.backend_api.task_end import TaskEndSpec

    write_eval(run, 18, 0.8)  # a pass at step 18
    where = f"JobSet default/{name[18]}"
    outcome = JobOutcome(triggers[18].ref, "succeeded", f"{where}: succeeded")
    end = end_task(TaskEndSpec.from_kwargs(json.loads(json.dumps(spec))), outcome)  # type: ignore[arg-type]
    assert end is not None and end.state == "success", end
    assert end.xcoms["return_value"]["target_reached"] is True
    assert fake_gke.deleted == [name[20]]  # running: deleted; 21 finished, 19 had none
