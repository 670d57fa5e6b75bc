"""Deployment settings and the local job runner, without running Airflow."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from tasks.deployment import REPO_ROOT, DeploymentError, load_deployment, parse_deployment
from tasks.local_jobs import JobFailed, module_command, run_job, train_args


def test_embedded_default_is_local_cpu_under_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RCPFLOW_DEPLOYMENT", raising=False)
    d = load_deployment()
    assert (d.backend, d.eval_window, d.schedule) == ("local", 1, None)
    assert d.storage_root == str(REPO_ROOT / "runs")
    assert d.job_env["JAX_PLATFORMS"] == "cpu"
    assert d.job_python == sys.executable


def test_a_file_overrides_and_resolves_relative_paths(tmp_path: Path) -> None:
    text = 'storage_root = "out"\neval_window = 3\nsubmission_schedule = "@weekly"\n'
    d = parse_deployment(text, source="f.toml", base_dir=tmp_path)
    assert d.storage_root == str(tmp_path / "out")
    assert (d.eval_window, d.schedule) == (3, "@weekly")
    gcs = parse_deployment('storage_root = "gs://b/p/"\n', source="f.toml", base_dir=tmp_path)
    assert gcs.storage_root == "gs://b/p"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("eval_windw = 2\n", "unknown key(s) eval_windw"),
        ('eval_window = "2"\n', "eval_window must be int"),
        ("eval_window = 0\n", "eval_window must be >= 1"),
        ('backend = "k8s"\n', "backend must be one of"),
        ('backend = "gke"\n', "backend 'gke' needs a [gke] table"),
        ('[gke]\ncluster_nam = "x"\n', "gke: unknown key(s) cluster_nam"),
        ("[job_env]\nX = 1\n", "job_env.X must be str"),
        ("eval_window = \n", "not valid TOML"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(DeploymentError) as refused:
        parse_deployment(text, source="f.toml", base_dir=tmp_path)
    assert named in str(refused.value)
    assert "f.toml" in str(refused.value)


def test_job_arguments_are_a_list_without_a_shell() -> None:
    argv = module_command(
        "/py",
        "tpu_jobs.train",
        train_args(
            run_dir="/r; rm -rf /",
            seed=1,
            global_batch_size=256,
            max_steps=40,
            val_start_at=None,
            division="open",
        ),
    )
    assert argv[:3] == ["/py", "-m", "tpu_jobs.train"]
    assert argv[argv.index("--run-dir") + 1] == "/r; rm -rf /"  # one argument, never parsed
    assert "--val-start-at" not in argv


@pytest.mark.timeout(60)
def test_run_job_streams_output_and_fails_with_its_tail(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tasks.local_jobs")
    run_job([sys.executable, "-c", "print('step 1'); print('step 2')"], name="ok job")
    assert "ok job | step 1" in caplog.text and "ok job | step 2" in caplog.text
    code = "import sys; print('about to fail'); sys.exit(3)"
    with pytest.raises(JobFailed) as failed:
        run_job([sys.executable, "-c", code], name="bad job")
    assert "bad job exited with status 3" in str(failed.value)
    assert "about to fail" in str(failed.value)
    with pytest.raises(JobFailed, match="could not start"):
        run_job(["/nonexistent/python"], name="missing")
