"""The demo's submission conf: what the submission DAG's Params accept, the rules' target taken
from rcpflow (not typed again), and the entry point that `make demo` runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from devtools.demo import HOME, NAME, STORAGE_ROOT, demo_conf, main
from rcpflow import recipe
from rcpflow.records.mllog import read_events
from tasks.deployment import DEFAULT_TOML, parse_deployment
from tasks.names import CHECK_TOOLS
from tasks.results.verdicts import read_verdict
from tasks.submission.spec import submission_params, submission_spec


def test_the_demo_conf_is_a_valid_submission_with_the_rules_target(tmp_path: Path) -> None:
    conf = demo_conf([1, 2, 3], global_batch_size=256, max_steps=40)
    assert conf["target"] == recipe.TARGET_ACCURACY
    # the conf over the form's defaults, as the triggered DAG run resolves its Params
    deployment = parse_deployment(DEFAULT_TOML, source="default", base_dir=tmp_path)
    params = {name: p.value for name, p in submission_params(deployment).items()} | conf
    spec = submission_spec(params, run_id="manual__demo", backend="local", source="the demo")
    assert spec.target == recipe.TARGET_ACCURACY
    assert spec.seeds == (1, 2, 3) and spec.backend == "local"


def test_the_demo_answers_help_from_the_repository_root() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devtools.demo", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "python -m devtools.demo" in done.stdout
    assert "--trainer" in done.stdout and "--ui-only" in done.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--executor", "celery"], "usage error: --executor celery needs --backend slurm"),
        (["--backend", "slurm", "--trainer", "tunix"], "error: --backend slurm runs the toy jobs"),
    ],
)
def test_a_request_the_demo_cannot_run_is_one_line_and_exit_2_before_anything_starts(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    home_before = HOME.exists()
    sigterm = signal.getsignal(signal.SIGTERM)  # main sets its own, for the demo's process
    try:
        assert main(argv) == 2
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert capsys.readouterr().err.startswith(said)
    assert HOME.exists() == home_before  # no Airflow home made, no cluster started


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_demo_passes_every_checker_with_the_embedded_default() -> None:
    """`make demo` as a new user runs it: the three-seed submission on the embedded default
    (local backend, LocalExecutor on SQLite, the default deployment's eval_retries), in the
    demo's own folders. It failed 4 runs in 6 when Airflow's deferral race took a decided
    evaluation (tests/airflow/test_airflow_deferral_race.py forces that order)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "RCPFLOW_"))}
    argv = ["--trainer", "toy", "--backend", "local", "--executor", "local"]  # as the Makefile
    done = subprocess.run(
        [sys.executable, "-m", "devtools.demo", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    tail = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, tail
    assert "**Verdict: PASS**" in done.stdout, tail
    for checker in CHECK_TOOLS:
        assert f"- {checker}: PASS" in done.stdout, tail
    out = STORAGE_ROOT / NAME
    for seed in (1, 2, 3):
        log = out / "runs" / f"seed_{seed}" / "mllog" / f"seed_{seed}.out"
        stops = [e for e in read_events(str(log)) if e.key == "run_stop"]
        assert [s.metadata["status"] for s in stops] == ["success"], (seed, tail)
        run_check = read_verdict(str(out / "runs" / f"seed_{seed}"), "compliance_checker")
        assert run_check is not None and run_check.ok, (seed, run_check)
    # The three-seed submission on SQLite under the real scheduler: what
    # tests/airflow/test_airflow_scheduler_e2e.py asserts of it on PostgreSQL, from the folders.
    (system,) = (out / "submission" / "systems").iterdir()
    results = out / "submission" / "results" / system.stem / "qwen35_397b_grpo"
    assert sorted(p.name for p in results.iterdir()) == [f"result_{i}.txt" for i in range(3)]
    verdicts = {t: read_verdict(str(out), t) for t in CHECK_TOOLS}
    assert all(v is not None and v.ok for v in verdicts.values()), verdicts
    score = verdicts["result_summarizer"].score_minutes  # type: ignore[union-attr]
    assert score is not None and score > 0
    assert "**Verdict: PASS**" in (out / "report.md").read_text()
    assert "Airflow stopped" in done.stdout, tail
