"""dag.test() of mlperf_grpo_run with NeMo-RL-shaped jobs (tests/foreign/nemo_*.py) from the
deployment's [jobs] templates: the trainer writes its own MLLOG (MLPERF_MLLOG_FILE, set by the
job template) and its step_<N>/ tree, which the run DAG imports as the manifest; the deferred
evaluator runs on a view of one checkpoint with a scratch MLLOG, whose accuracy is imported; the
run is finalized by rcpflow and every checker passes, under either schedule; then the run's
retention task (the deployment's [retention] keep = "passing") deletes every checkpoint but the
passing one, and the RCP view says which went and why (during training also after each step's
evaluation: [retention] while_training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import DagRunResult, Recording, failures, launched_jobs
from foreign.deployment import (
    FOREIGN_RUN,
    NEMO_EVALUATOR,
    NEMO_TRAINER,
    PASSING_STEP,
    write_nemo_deployment,
)
from foreign_runs import (
    assert_decided_at_the_passing_step,
    assert_nemo_outputs_imported,
    run_foreign_dag,
)

from rcpflow.retention.apply import read_record

FIRST, LAST = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", ["after_training", "during_training"])
def test_a_nemo_rl_run_through_the_run_dag_ends_compliant(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording, schedule: str
) -> None:
    during = schedule == "during_training"
    deployment = write_nemo_deployment(
        tmp_path / "d.toml",
        python=recording.python,
        eval_schedule=schedule,
        retention="passing",
        retention_while_training=during,
    )

    result = run_foreign_dag(deployment, run_dir)

    assert result.state == "success", failures(result)
    jobs = launched_jobs(recording.record)
    assert jobs[0].startswith(f"{NEMO_TRAINER} --checkpoint-dir {run_dir}/checkpoints ")
    # each evaluation's --checkpoint-root: <run_dir>/nemo_eval/step_<N>/view
    evaluated = sorted(
        int(j.split("--checkpoint-root ")[1].split("/view")[0].rsplit("_", 1)[1]) for j in jobs[1:]
    )
    assert all(j.startswith(str(NEMO_EVALUATOR)) for j in jobs[1:])
    ran = list(range(FIRST, PASSING_STEP + 1))
    assert evaluated in (ran, [*ran, LAST])
    for own in assert_nemo_outputs_imported(run_dir, ran).values():
        assert [e.key for e in own][-1] == "run_stop"  # its own: ignored
    assert result.states[("evaluation.check", -1)] == "success"
    events = assert_decided_at_the_passing_step(run_dir, ran)
    assert len([e for e in events if e.key == "tracked_stats"]) == LAST + len(ran)
    assert_retention_kept_only_the_passing_checkpoint(result, run_dir)
    applies = read_record(str(run_dir))["applies"]  # type: ignore[index]
    if during:  # the steps below the pass went in their evaluate tasks, before the final task
        *each, final = applies
        assert each and not any(a["settled"] for a in each) and final["settled"] is True
        early = {p["step"] for a in each for p in a["parts"] if p.get("outcome") == "deleted"}
        assert set(range(FIRST, PASSING_STEP)) <= early and PASSING_STEP not in early
    else:
        assert len(applies) == 1


def assert_retention_kept_only_the_passing_checkpoint(result: DagRunResult, run_dir: Path) -> None:
    from plugins.rcp_view.pages import run_page
    from tasks.views.storage_index import read_run

    assert result.states[("retention", -1)] == "success"
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == [f"step_{PASSING_STEP}"]
    page = run_page(read_run(str(run_dir), "run"), None, "/rcp/")
    for step in range(FIRST, LAST + 1):
        state = "kept" if step == PASSING_STEP else "gone"
        assert f"<tr data-step='{step}' data-part='checkpoint' data-state='{state}'>" in page
    assert "above the passing step 5" in page and "evaluated below the target" in page
