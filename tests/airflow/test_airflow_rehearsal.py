"""dag.test() of mlperf_grpo_run with the rehearsal deployment (docker/deployment.rehearsal.toml):
the job templates run the rehearsal trainer and evaluator on the local backend, the evaluator's
Tunix tree is imported and verified, and the run ends in a log the compliance checker passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import REPO, Recording, failures, launched_jobs, run_dag_test

from rcpflow.files.layout import RunLayout
from rcpflow.planning.rehearsal import load_curve
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events
from rcpflow.records.summary import read_summary
from tasks.deployment import parse_deployment
from tasks.results.verdicts import read_verdict

DEPLOYMENT = REPO / "docker" / "deployment.rehearsal.toml"
CURVE = load_curve(str(REPO / "tpu_jobs" / "rehearsal" / "curve.csv"))
# Seed 3 of the shipped curve first passes at step 19; steps 20..24 are left to skip.
RUN = {"seed": 3, "global_batch_size": 256, "max_steps": 24, "val_start_at": 18}


def test_the_rehearsal_deployment_runs_the_rehearsal_jobs_locally() -> None:
    d = parse_deployment(DEPLOYMENT.read_text(), source=str(DEPLOYMENT), base_dir=DEPLOYMENT.parent)
    assert d.backend == "local" and d.storage_root == str(REPO / "runs")
    assert d.jobs.train.command[:3] == ("{python}", "-m", "tpu_jobs.rehearsal.train")
    assert d.jobs.evaluate.command[:3] == ("{python}", "-m", "tpu_jobs.rehearsal.evaluate")
    assert d.jobs.evaluate.result.format == "tunix-tree"
    assert d.jobs.evaluate.result.path == "{run_dir}/rehearsal_eval"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("division", ["open", "closed"])
def test_run_dag_with_the_rehearsal_jobs_ends_compliant(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording, division: str
) -> None:
    # The shipped file with the recording interpreter, and no waiting (time scale 0).
    text = DEPLOYMENT.read_text().replace('"--time-scale", "0.005"', '"--time-scale", "0"')
    assert text.count('"--time-scale", "0"') == 2
    deployment = tmp_path / "deployment.toml"
    # run_dir is in the test's temp dir, outside the file's storage root
    outside = "allow_run_dirs_outside_root = true\n"
    deployment.write_text(f"python = {json.dumps(str(recording.python))}\n{outside}" + text)
    conf = {**RUN, "division": division, "run_dir": str(run_dir)}

    result = run_dag_test("mlperf_grpo_run", conf, deployment)

    assert result.state == "success", failures(result)
    jobs = [j.split() for j in launched_jobs(recording.record)]
    assert [j[1] for j in jobs[:1]] == ["tpu_jobs.rehearsal.train"]
    assert all(j[1] == "tpu_jobs.rehearsal.evaluate" for j in jobs[1:]), jobs
    evaluated = sorted(int(j[j.index("--step") + 1]) for j in jobs[1:])
    passing = CURVE.first_pass(3, 18, 24)
    assert passing == 19
    # dag.test() may run a later step's instance before the pass: it then evaluates too
    assert evaluated[:2] == [18, 19] and len(set(evaluated)) == len(evaluated)
    layout = RunLayout(str(run_dir))
    rows = load(layout.manifest).rows
    assert [r.step for r in rows] == list(range(18, 25))
    for step in (18, 19):
        (tunix,) = (run_dir / "rehearsal_eval" / f"step_{step}").glob("*/summary.json")
        imported = read_summary(layout.summary(step))
        assert imported.pass_at_k == json.loads(tunix.read_text())["pass_at_k"]
        assert imported.eval_accuracy == CURVE.pass_at_4(3, step)
        assert rows[step - 18].timestamp_ms <= imported.eval_start_ms  # the step's own clock
    events = read_events(layout.mllog(3))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.time_ms == rows[passing - 18].timestamp_ms
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    assert result.states[("evaluation.check", -1)] == "success"
