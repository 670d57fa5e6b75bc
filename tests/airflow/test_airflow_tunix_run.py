"""dag.test() of mlperf_grpo_run with the Tunix deployment (docker/deployment.tunix.toml): the
job templates run Tunix's GRPO trainer and its evaluator on the local backend, to a compliant log.

The DAG test is skipped only when the ``tunix`` extra is not installed (CI installs it with
``.[all]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_harness import REPO, failures, launched_jobs, recording_python, run_dag_test
from passing_runs import check_passed

from tasks.deployment import parse_deployment

TUNIX_DEPLOYMENT = REPO / "docker" / "deployment.tunix.toml"
# Seed 0 of the Tunix policy at gbs 256 passes pass@4 > 0.69 at step 20 (measured on CPU, one
# device: 0.63 at steps 16-18, 0.67 at 19, 0.73 at 20); the steps after it are left to skip.
TUNIX_RUN = {
    "seed": 0,
    "global_batch_size": 256,
    "max_steps": 24,
    "val_start_at": 16,
    "division": "open",
}


def test_the_tunix_deployment_runs_the_tunix_jobs_locally() -> None:
    d = parse_deployment(
        TUNIX_DEPLOYMENT.read_text(), source=str(TUNIX_DEPLOYMENT), base_dir=TUNIX_DEPLOYMENT.parent
    )
    assert d.backend == "local" and d.storage_root == str(REPO / "runs")
    assert d.jobs.train.command[:3] == ("{python}", "-m", "tpu_jobs.tunix_train")
    assert d.jobs.evaluate.command[:3] == ("{python}", "-m", "tpu_jobs.tunix_evaluate")
    assert d.jobs.evaluate.result.format == "rcpflow"  # the evaluator writes rcpflow's summary


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_dag_with_the_tunix_jobs_ends_compliant(airflow_db: str, tmp_path: Path) -> None:
    pytest.importorskip("tunix", reason="google-tunix (the project's `tunix` extra) is missing")
    run_dir = tmp_path / "run"
    python, record = recording_python(tmp_path)
    # The shipped file, with only the interpreter swapped for the recording one (a top-level key
    # before the file's tables).
    deployment = tmp_path / "deployment.toml"
    # (and run_dir in the test's temp dir, outside the file's storage root)
    outside = "allow_run_dirs_outside_root = true\n"
    deployment.write_text(f'python = "{python}"\n{outside}' + TUNIX_DEPLOYMENT.read_text())

    result = run_dag_test("mlperf_grpo_run", {**TUNIX_RUN, "run_dir": str(run_dir)}, deployment)

    assert result.state == "success", failures(result)
    jobs = [j.split() for j in launched_jobs(record)]
    assert [j[1] for j in jobs if "train" in j[1]] == ["tpu_jobs.tunix_train"]
    evaluated = [int(j[j.index("--step") + 1]) for j in jobs if j[1] == "tpu_jobs.tunix_evaluate"]
    assert all(j[1] in ("tpu_jobs.tunix_train", "tpu_jobs.tunix_evaluate") for j in jobs), jobs
    assert len(evaluated) == len(set(evaluated))  # no checkpoint evaluated twice

    first, last = TUNIX_RUN["val_start_at"], TUNIX_RUN["max_steps"]
    passed, rows = check_passed(
        result,
        run_dir,
        seed=TUNIX_RUN["seed"],
        gbs=TUNIX_RUN["global_batch_size"],
        first=first,
        evaluated=evaluated,
    )
    assert [r.step for r in rows] == list(range(first, last + 1))
    # Tunix's own checkpoints (its actor/<step> layout), one per row.
    for r in rows:
        assert r.checkpoint_path == str(run_dir / "checkpoints" / "actor" / str(r.step))
        assert Path(r.checkpoint_path, "commit_success.txt").exists()
    assert first <= passed < last
