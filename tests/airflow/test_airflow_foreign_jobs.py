"""dag.test() with foreign jobs: a trainer and an evaluator that are not rcpflow's toy
(tests/foreign), run from the deployment's [jobs] templates, ending in a compliant log; and the
deferred evaluation's backfill from a Tunix-style tree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from airflow_harness import (
    PYTHON,
    Recording,
    failures,
    launched_jobs,
    recording_python,
    run_dag_test,
)
from foreign.deployment import (
    EVALUATOR,
    FOREIGN_RUN,
    PASSING_STEP,
    TRAINER,
    run_flags,
    write_foreign_deployment,
)
from foreign_runs import assert_decided_at_the_passing_step, run_foreign_dag

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import EventRenderer, read_events
from rcpflow.records.summary import read_summary
from rcpflow.submission.checkers import compliance

EVALUATE = "evaluation.evaluate"  # the deferred-eval DAG's, mapped over rows
RUN_EVALUATE = "evaluation.checkpoint.evaluate"  # the run DAG's, per planned step
FIRST, LAST = FOREIGN_RUN["val_start_at"], FOREIGN_RUN["max_steps"]


def _tree_attempts(run_dir: Path, step: int) -> list[Path]:
    return sorted((run_dir / "tunix_eval" / f"step_{step}").glob("*/summary.json"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("rows", ["recorder", "cli"])
def test_foreign_trainer_and_evaluator_end_in_a_compliant_log(
    airflow_db: str, tmp_path: Path, run_dir: Path, recording: Recording, rows: str
) -> None:
    deployment = write_foreign_deployment(tmp_path / "d.toml", python=recording.python, rows=rows)

    result = run_foreign_dag(deployment, run_dir)

    assert result.state == "success", failures(result)
    jobs = launched_jobs(recording.record)
    assert jobs[0].startswith(f"{TRAINER} --run-dir {run_dir} --ckpt-root {run_dir}/own_")
    layout = RunLayout(str(run_dir))
    manifest = load(layout.manifest)
    ran = list(range(FIRST, PASSING_STEP + 1))
    # dag.test() runs mapped instances in its own order, so step 6 may have started before
    # step 5 passed; the scheduler e2e checks the step order
    launched = sorted(int(j.split(" --step ")[1].split()[0]) for j in jobs[1:])
    assert launched in (ran, [*ran, LAST])
    assert all(
        j.startswith(f"{EVALUATOR} --checkpoint {run_dir}/own_checkpoints/") for j in jobs[1:]
    )
    assert result.mapped(RUN_EVALUATE)[: len(ran)] == ["success"] * len(ran)
    for step in ran:
        # What the evaluator left is Tunix's format (no wall clock) ...
        [tunix] = _tree_attempts(run_dir, step)
        raw = json.loads(tunix.read_text())
        assert "eval_start_ms" not in raw and raw["rcp_logged"] is False
        # ... imported with the evaluate step's own clock, after the checkpoint existed
        summary = read_summary(layout.summary(step))
        assert summary.pass_at_k == raw["pass_at_k"]
        assert manifest.row(step).timestamp_ms <= summary.eval_start_ms <= summary.eval_stop_ms
        assert (Path(layout.attempts_dir(step)) / "attempts.jsonl").exists()
    assert result.states[("evaluation.check", -1)] == "success"
    assert_decided_at_the_passing_step(run_dir, ran)


@pytest.mark.timeout(600)
def test_a_foreign_summary_its_attempts_contradict_fails_without_run_stop(
    airflow_db: str, tmp_path: Path, run_dir: Path
) -> None:
    deployment = write_foreign_deployment(
        tmp_path / "d.toml", evaluate_extra=("--corrupt", "pass4")
    )

    result = run_foreign_dag(deployment, run_dir)

    assert result.state == "failed"
    assert result.mapped(RUN_EVALUATE)[0] == "failed"
    assert _tree_attempts(run_dir, FIRST)  # the job ran and left its (lying) summary
    layout = RunLayout(str(run_dir))
    assert not Path(layout.summary(FIRST)).exists()  # nothing imported
    assert not [e for e in read_events(layout.mllog(1)) if e.key == "run_stop"]


def _train(run_dir: Path) -> None:
    argv = [PYTHON, str(TRAINER), "--run-dir", str(run_dir), "--ckpt-root", str(run_dir / "ck")]
    argv += run_flags(FOREIGN_RUN)
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def _evaluate_into(tree: Path, run_dir: Path, step: int) -> None:
    ckpt = load(RunLayout(str(run_dir)).manifest).row(step).checkpoint_path
    argv = [PYTHON, str(EVALUATOR), "--checkpoint", ckpt, "--step", str(step)]
    subprocess.run([*argv, "--output-root", str(tree)], check=True, capture_output=True)


def _pipeline_log(path: Path, run_dir: Path, steps: list[int]) -> None:
    """What Tunix's pipeline logs around its evaluator: eval_start/eval_stop per checkpoint,
    keyed by samples_count (rendered by the official mllog API)."""
    renderer, lines = EventRenderer(), []
    for step in steps:
        row = load(RunLayout(str(run_dir)).manifest).row(step)
        meta = {"samples_count": row.samples_count, "step": step}
        start = row.timestamp_ms + 1000 * step
        lines.append(renderer.render("start", "eval_start", None, meta, start))
        lines.append(renderer.render("end", "eval_stop", None, meta, start + 1697))
    path.write_text("".join(line + "\n" for line in lines))


@pytest.mark.timeout(600)
def test_backfill_imports_a_tunix_tree_and_evaluates_only_the_rest(
    airflow_db: str, tmp_path: Path
) -> None:
    run_dir, tree, log = tmp_path / "run", tmp_path / "tunix_eval_old", tmp_path / "pipeline.log"
    _train(run_dir)
    for step in (2, 3, 4):
        _evaluate_into(tree, run_dir, step)
    _pipeline_log(log, run_dir, [2, 3])  # step 4's times were never logged: not importable
    python, record = recording_python(tmp_path)
    deployment = write_foreign_deployment(tmp_path / "d.toml", python=str(python))
    conf = {"run_dir": str(run_dir), "eval_tree": str(tree), "eval_times_from": str(log)}

    result = run_dag_test("mlperf_grpo_deferred_eval", conf, deployment)

    assert result.state == "success", failures(result)
    assert result.states[("import_eval_tree", -1)] == "success"
    # 2 and 3 imported from the tree; 4 (refused: no eval times) and 5 evaluated; 6 skipped
    launched = sorted(j.split(" --step ")[1].split()[0] for j in launched_jobs(record))
    assert launched in (["4", "5"], ["4", "5", "6"])  # 6: if dag.test() ran it before 5 passed
    assert result.mapped(EVALUATE)[:4] == ["success"] * 4
    layout = RunLayout(str(run_dir))
    row2 = load(layout.manifest).row(2)
    imported = read_summary(layout.summary(2))
    assert (imported.eval_start_ms, imported.eval_stop_ms) == (
        row2.timestamp_ms + 2000,
        row2.timestamp_ms + 2000 + 1697,
    )
    (stop,) = [e for e in read_events(layout.mllog(1)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    assert stop.metadata["samples_count"] == PASSING_STEP * 16
    check = compliance(layout.mllog(1), division="open", log_dir=str(tmp_path / "chk"))
    assert check.ok, check.output


@pytest.mark.timeout(300)
def test_a_tree_without_summaries_is_refused_by_name(airflow_db: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _train(run_dir)
    (tmp_path / "empty").mkdir()
    conf = {"run_dir": str(run_dir), "eval_tree": str(tmp_path / "empty"), "eval_times_from": None}

    result = run_dag_test(
        "mlperf_grpo_deferred_eval", conf, write_foreign_deployment(tmp_path / "d.toml")
    )

    assert result.state == "failed"
    assert result.states[("import_eval_tree", -1)] == "failed"
    assert "success" not in result.mapped(EVALUATE)  # nothing evaluated
