"""Foreign job templates on GKE: the bring-your-own example deployment parses and its JobSets
pass the JobSet CRD schema with the jobs' own images, environments and commands; the evaluate
operator imports a foreign (Tunix-format) result when its JobSet succeeded."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_task import FakeTI
from foreign.deployment import EVALUATOR, FOREIGN_RUN, TRAINER, evaluate_command
from repo_paths import REPO

from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import ManifestRow, load
from rcpflow.records.summary import read_summary
from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings
from tasks.deployment import parse_deployment
from tasks.jobs.templates import EvalResult, EvaluateJob
from tasks.jobs.values import evaluate_values, train_values
from tasks.run.spec import RunSpec
from tasks.run.stages import EvaluationError

EXAMPLE = REPO / "docker" / "deployment.byo.example.toml"
RUN_ID = "manual__2026-05-01T12:00:00+00:00"


def _example():
    return parse_deployment(EXAMPLE.read_text(), source=str(EXAMPLE), base_dir=EXAMPLE.parent)


def _container(jobset: dict) -> dict:
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return container


def test_the_byo_example_renders_valid_jobsets_with_its_own_images(
    strict_jobset, lenient_jobset
) -> None:
    d = _example()
    gke = d.table("gke", GkeSettings)
    assert gke is not None and d.jobs.evaluate.result == EvalResult(
        "tunix-tree", "{run_dir}/tunix_eval"
    )
    run = RunSpec("gs://b/runs/seed_1", 1, 256, 40, None, "closed")
    train = render_jobset(
        gke, role="train", dag_id="mlperf_grpo_run", run_id=RUN_ID, job="train",
        command=d.jobs.train.job_command.render(train_values(run.job_values(), "python")),
        image=d.jobs.train.image, env=d.jobs.train.env,
    )  # fmt: skip
    row = ManifestRow(
        step=18, checkpoint_path="gs://b/runs/seed_1/tunix_checkpoints/actor/18",
        timestamp_ms=1_790_000_000_000, samples_count=18 * 256, global_batch_size=256,
        batch_size=16, num_generations=16, val_start_at=18, max_steps=40, target_accuracy=0.69,
        seed=1, mllog_file="gs://b/runs/seed_1/mllog/seed_1.out",
    )  # fmt: skip
    values = evaluate_values(run.run_dir, row, "python")
    evaluate = render_jobset(
        gke, role="evaluate", dag_id="mlperf_grpo_run", run_id=RUN_ID, job="eval-18",
        command=d.jobs.evaluate.job_command.render(values),
        image=d.jobs.evaluate.image, env=d.jobs.evaluate.env,
    )  # fmt: skip
    for jobset in (train, evaluate):
        assert strict_jobset.errors(jobset) == []
        assert lenient_jobset.errors(jobset) == []
    t, e = _container(train), _container(evaluate)
    assert t["image"].endswith("/trainers/tunix-grpo:2026.11")
    assert e["image"].endswith("/evaluators/deepswe-eval:2026.11")
    assert t["command"][:3] == ["python", "-m", "my_tunix_grpo.train"]
    assert t["command"][t["command"].index("--val-start-at") + 1] == "18"
    assert e["command"][e["command"].index("--checkpoint") + 1] == row.checkpoint_path
    assert e["command"][-1] == "gs://b/runs/seed_1/tunix_eval"
    assert {"name": "DEEPSWE_SANDBOX_POOL", "value": "mlperf"} in e["env"]
    assert {"name": "XLA_FLAGS", "value": d.jobs.train.env["XLA_FLAGS"]} in t["env"]
    names = [v["name"] for v in e["env"]]
    assert "RCPFLOW_SLICE_INDEX" in names and len(names) == len(set(names))


def test_job_env_values_are_literal_on_the_cluster(strict_jobset) -> None:
    d = _example()
    gke = d.table("gke", GkeSettings)
    assert gke is not None
    jobset = render_jobset(
        gke, role="train", dag_id="d", run_id="r", job="train", command=["python"],
        env={"NOTE": "$(HOME)/x"},
    )  # fmt: skip
    assert strict_jobset.errors(jobset) == []
    assert {"name": "NOTE", "value": "$$(HOME)/x"} in _container(jobset)["env"]


def test_the_evaluate_operator_imports_a_foreign_result_after_its_jobset(
    fake_gke, recorded_status, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from tasks.backend_api.job_state import JobState
    from tasks.backends.gke.driver import GkeDriver
    from tasks.backends.gke.settings import GkeSettings
    from tasks.run.evaluate_operator import EvaluateOperator

    run_dir = tmp_path / "run"
    argv = [sys.executable, str(TRAINER), "--run-dir", str(run_dir)]
    argv += ["--ckpt-root", str(run_dir / "ck"), "--skill-start", "0.6"]
    for key in ("seed", "global_batch_size", "max_steps", "val_start_at", "division"):
        argv += [f"--{key.replace('_', '-')}", str(FOREIGN_RUN[key])]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    layout = RunLayout(str(run_dir))
    row = load(layout.manifest).row(2)
    job = EvaluateJob(
        command=tuple(evaluate_command()),
        image="registry/deepswe-eval:1",
        result=EvalResult("tunix-tree", "{run_dir}/tunix_eval"),
    )
    settings = GkeSettings(use_dns_endpoint=True, poll_interval_s=0.01)
    # the deployment's driver: the evaluation image is its [jobs.evaluate] image
    driver = GkeDriver(settings, images={"evaluate": job.image})
    op = EvaluateOperator(
        task_id="evaluation.evaluate", driver=driver, eval_job=job, run_dir=str(run_dir),
        row=dataclasses.asdict(row),
    )  # fmt: skip
    ti = FakeTI(task_id="evaluation.evaluate", map_index=0)  # step 2 of 2..6
    fake_gke.statuses = [recorded_status("status_succeeded.json")["status"]]
    context: Any = {"ti": ti, "dag_run": SimpleNamespace(dag_id="mlperf_grpo_run", run_id=RUN_ID)}
    with pytest.raises(TaskDeferred):
        op.execute(context)

    [created] = fake_gke.objects.values()
    command = _container(created)["command"]
    assert command[:2] == ["python", str(EVALUATOR)]
    assert _container(created)["image"] == "registry/deepswe-eval:1"
    assert ti.pushed["eval_start"]["baseline"] == {"attempts": [], "digest": None}
    # What the pod would do: the evaluator, on the checkpoint, into the Tunix tree.
    subprocess.run([sys.executable, *command[1:]], check=True, capture_output=True)
    ref = {"name": created["metadata"]["name"], "namespace": "default"}
    succeeded = JobState("succeeded [1/1]", "succeeded").as_json()
    event = {"phase": "ended", "reason": "", "message": "", "ref": ref, "budget": {},
             "state": succeeded, "kwargs": None}  # fmt: skip
    passed = op.execute_complete(context, event)  # skill 0.8 at step 2: it passes
    assert passed["step"] == 2 and passed["target_reached"] is True
    summary = read_summary(layout.summary(2))
    assert row.timestamp_ms <= ti.pushed["eval_start"]["ms"] == summary.eval_start_ms
    assert summary.eval_stop_ms >= summary.eval_start_ms
    # A JobSet that succeeded without adding an attempt: what was there before is not imported.
    again = FakeTI(task_id="evaluation.evaluate", map_index=0)
    before = sorted(str(p) for p in (run_dir / "tunix_eval" / "step_2").glob("*/summary.json"))
    again.pushed["eval_start"] = {"ms": 0, "baseline": {"attempts": before, "digest": None}}
    with pytest.raises(EvaluationError, match="left no new attempt under"):
        op.execute_complete({**context, "ti": again}, event)


def test_a_nemo_rl_train_jobset_gets_the_run_folders_mllog(tmp_path: Path) -> None:
    """The NeMo-RL train result on GKE: the JobSet's env holds MLPERF_MLLOG_FILE, the run
    folder's MLLOG, as the local backend's job does (`job_inputs.train_inputs`)."""
    from foreign.deployment import write_nemo_deployment

    from tasks.backend_api.job_inputs import train_inputs
    from tasks.backend_api.job_operator import RunJobOperator
    from tasks.backends.gke.driver import GkeDriver

    path = write_nemo_deployment(tmp_path / "d.toml")
    job = parse_deployment(path.read_text(), source=str(path), base_dir=tmp_path).jobs.train
    run = RunSpec("gs://b/runs/seed_1", 1, 16, 6, 2, "open")
    inputs = train_inputs(job, run.job_values(), "python")
    op = RunJobOperator(
        task_id="train.job.run", driver=GkeDriver(GkeSettings(use_dns_endpoint=True)),
        role="train", label="train", argv=inputs["argv"], env={"A": "1"}, run_env=inputs["env"],
    )  # fmt: skip
    context: Any = {
        "ti": FakeTI(task_id="train.job.run"),
        "dag_run": SimpleNamespace(dag_id="mlperf_grpo_run", run_id=RUN_ID),
    }
    rendered = op.driver.render(op.request(context))  # the JobSet the driver creates
    env = {e["name"]: e.get("value") for e in _container(rendered)["env"]}
    assert env["MLPERF_MLLOG_FILE"] == "gs://b/runs/seed_1/mllog/seed_1.out"
    assert env["A"] == "1" and env["RCPFLOW_RUN_OWNER"]
